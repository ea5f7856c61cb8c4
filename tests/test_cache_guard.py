"""The suite runs away from the user's prepared data (tests/cache_guard.py, conftest.py)."""

import os
import shutil
import subprocess
import sys

import cache_guard

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_session_data_dir_and_home_are_the_suites_own():
    from t5lite import dataprep
    sandbox = os.environ[cache_guard.SANDBOX_ENV]
    assert dataprep.data_dir().startswith(sandbox + os.sep)
    assert os.path.expanduser("~").startswith(sandbox + os.sep)
    assert cache_guard.guarded(), "the user's data dirs are remembered"
    for real in cache_guard.guarded():
        assert not real.startswith(sandbox + os.sep)


def test_an_open_under_the_users_data_dir_is_recorded():
    probe = os.path.join(cache_guard.guarded()[0], "no-such-file-t5lite-guard-probe")
    try:
        open(probe).close()
    except OSError:
        pass
    assert cache_guard.take() == [f"open {probe}"]  # taken here, so this test passes


BAD_TESTS = '''
import os, subprocess, sys
TARGET = os.environ["BAD_TARGET"]

def test_reads_the_users_cache():
    open(os.path.join(TARGET, "MANIFEST.json")).read()

def test_a_subprocess_writes_into_it():
    subprocess.run([sys.executable, "-c",
                    f"open({os.path.join(TARGET, 'vocab_t5')!r}, 'w').write('x')"], check=True)

def test_stays_away(tmp_path):
    (tmp_path / "mine").write_text("fine")
'''


def test_a_suite_that_touches_the_users_data_fails(tmp_path):
    """A suite run on a machine with prepared data: the test that reads it fails, and the
    session fails when a subprocess (which no audit hook sees) wrote into it."""
    suite, home = tmp_path / "suite", tmp_path / "home"
    real = home / ".cache" / "t5lite"
    real.mkdir(parents=True)
    (real / "MANIFEST.json").write_text("{}")
    suite.mkdir()
    for name in ("conftest.py", "cache_guard.py", "suite_xla.py"):
        shutil.copy(os.path.join(HERE, name), suite / name)
    (suite / "test_bad.py").write_text(BAD_TESTS)
    env = {k: v for k, v in os.environ.items()
           if k not in (cache_guard.SANDBOX_ENV, cache_guard.GUARDED_ENV, "T5LITE_DATA_DIR")}
    env.update(HOME=str(home), BAD_TARGET=str(real))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", str(suite)], cwd=suite, env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 error" in out and "this test touched the user's data dirs" in out
    assert "ERROR test_bad.py::test_reads_the_users_cache" in out
    assert "FAILED: the suite changed the user's data dirs" in out and "vocab_t5" in out
