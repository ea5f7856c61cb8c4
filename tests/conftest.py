"""Test setup: 8 simulated CPU devices (set before jax is imported), quiet TF, slow marker.

Run everything with `pytest tests`; tests marked slow run only with `--runslow`.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# Only one process may load libtpu unless this is set: pytest-xdist workers that compile for a
# TPU topology (tests/test_compile.py) would fail on its lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import pytest  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running; run with --runslow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A small prepared data dir (tests/tasks_testdata.py) as $T5LITE_DATA_DIR for a module."""
    import tasks_testdata
    root = str(tmp_path_factory.mktemp("t5lite_data"))
    restore = tasks_testdata.use_data_dir(root)
    import t5lite.tasks  # noqa: F401
    yield root
    restore()
