"""Test setup: 8 simulated CPU devices and LLVM -O0 (set before jax is imported), quiet TF,
slow marker, and a sandbox: HOME and $T5LITE_DATA_DIR point at fresh empty folders for the
whole session, and a test that touches the user's real data dirs fails (tests/cache_guard.py).

Run everything with `pytest tests`; tests marked slow run only with `--runslow`.
"""

import os

import cache_guard  # tests/ is on sys.path: pytest puts a rootdir conftest's folder there
import suite_xla

# Before anything reads HOME or $T5LITE_DATA_DIR (t5lite, TF, matplotlib): a suite that
# passes only on a machine with prepared data, or that writes into it, is what this prevents.
OWN_SANDBOX = cache_guard.sandbox()
cache_guard.install()

suite_xla.apply()  # 8 simulated CPU devices, LLVM at -O0 (tests/suite_xla.py says why)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# Only one process may load libtpu unless this is set: pytest-xdist workers that compile for a
# TPU topology (tests/test_compile.py) would fail on its lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

# The suite is an entry point, as the CLI is: gs:// routing before any library picks its
# backend (gcsfs, etils.epath, tensorstore read their settings once). In a full run the GCS
# emulator tests failed when an earlier test had made that choice first (they pass alone).
from t5lite.store import gcs  # noqa: E402

gcs.configure()

import pytest  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running; run with --runslow")


_before_session: dict = {}


def pytest_sessionstart(session):
    if OWN_SANDBOX:
        _before_session.update(cache_guard.snapshot())


def pytest_sessionfinish(session, exitstatus):
    """The process that made the sandbox removes it, and fails the session when anything
    (subprocesses and non-Python readers included) changed the user's real data dirs."""
    if not OWN_SANDBOX:
        return
    changed = cache_guard.changes(_before_session, cache_guard.snapshot())
    cache_guard.remove()
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line(f"FAILED: the suite changed the user's data dirs "
                            f"({len(changed)} paths, e.g. {changed[:3]}): tests must use "
                            "their own data dir (tests/cache_guard.py)", red=True)
        session.exitstatus = 1


@pytest.fixture(autouse=True)
def _away_from_the_users_data():
    """Fails a test that opened, listed or wrote anything under the user's real data dirs."""
    early = cache_guard.take()
    if early:
        pytest.fail(f"an import or an earlier fixture touched the user's data dirs: {early[:3]}")
    yield
    touched = cache_guard.take()
    if touched:
        pytest.fail(f"this test touched the user's data dirs ({len(touched)} operations, e.g. "
                    f"{touched[:3]}): give it a data dir of its own (tmp_path, the data_dir "
                    "fixture)")


# The longest tests (each 30 s to 3 min on the 2-core box, measured with --durations), started
# first: with `-n 2`, one of them started last kept one worker busy minutes after the other
# had finished. Only the order changes; a name missing here is run in its place.
LONG_FIRST = (
    "test_newcomer_task.py::", "test_finetune_e2e.py::test_quickstart_fast_pipeline",
    "test_compile.py::test_collective_matmuls_are_off",
    "test_compile.py::test_attention_heavy_bf16", "test_compile.py::test_remat_order_is_strict_and",
    "test_checkpointing.py::test_kill_and_resume_through_the_cli",
    "test_launch_worker.py::test_bare_worker_setup", "test_gpu_attention.py::test_t5_with",
    "test_paper_benchmarks.py::test_multitask_mixtures", "test_fewshot.py::test_eval_shots_command",
    "test_tasks.py::test_same_seed_same_batches", "test_flash_attention.py::test_t5_model_with_flash",
)


def _long_rank(item) -> int:
    nodeid = item.nodeid.split("/")[-1]
    return next((i for i, p in enumerate(LONG_FIRST) if nodeid.startswith(p)), len(LONG_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_long_rank)  # stable: the rest keep their order
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
