"""The catalogue of ways a hostile but ordinary user can hurt a run (issue "never lose a run").

Each case here starts from a copy of one trained tiny workdir (checkpoints 2 and 4, metrics lines
1-4), does one thing to it, and asserts the exit code, a one-line message that names the fix,
and that every checkpoint, metrics line and config that existed is still there (hash of every
file before / after; a damaged step may only have moved to corrupt_checkpoints/, unchanged).
In-process through t5lite.cli.main.main where possible; subprocesses only for signals, lock races
and what needs another user (root ignores file modes). The cases that need no trained workdir
are in tests/test_reliability_fresh.py; the helpers both use in tests/reliability_helpers.py.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from t5lite.cli import main as cli
from reliability_helpers import ROOT, _env, assert_kept, metrics_rows, run_cli, snapshot, train_args


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A 4-step run: checkpoints 2, 4; data_state 2, 4; metrics lines 1-4; and the copies of
    worker logs launch/tpu_job.sh keeps in a workdir (every case's snapshot checks that no
    guard or damage handling touches them)."""
    wd = tmp_path_factory.mktemp("trained") / "run"
    assert cli.main(train_args(wd)) == 0
    assert sorted(os.listdir(wd / "checkpoints")) == ["2", "4"]
    logs = wd / "worker_logs" / "20260101T000000Z"
    logs.mkdir(parents=True)
    (logs / "worker-0.log").write_text("=== t5lite job on worker 0\npreempted at step 2\n")
    return wd


@pytest.fixture
def wd(trained, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(trained, dst)
    return dst


# ---------------------------------------------------------------------------- refusals
# Each of these stops before writing anything: exit 2, one line, the workdir unchanged.

REFUSALS = {
    # item 1: a shape change is named, never "corruption"
    "shape_change": (["--set", "model.d_ff=96"],
                     r"model\.d_ff 64 -> 96.*new --workdir.*checkpoint\.init_from"),
    "dtype_and_objective_change": (["--set", "model.dtype=bfloat16", "--set", "optim.name=adamw"],
                                   r"model\.dtype 'float32' -> 'bfloat16'.*optim\.name"),
    # a safe change still needs the explicit flag
    "steps_change_without_flag": (["--set", "train.steps=6"],
                                  r"train\.steps 4 -> 6.*--allow-config-change"),
    "unsafe_change_with_flag": (["--set", "data.seed=3", "--allow-config-change"],
                                r"data\.seed 0 -> 3.*new --workdir"),
    # clipping switched on adds an optimizer transform: the saved state has another tree
    "clipping_switched_on_with_flag": (
        ["--set", "optim.clip_grad_norm=1.0", "--allow-config-change"],
        r"optim\.clip_grad_norm 0\.0 -> 1\.0.*optimizer state has another layout.*"
        r"checkpoint\.init_from=.*checkpoint\.init_state=true"),
    "malformed_skip_batches": (["--set", "train.skip_batches=4", "--allow-config-change"],
                               r"train\.skip_batches='4': give \"S:N\""),
    # item 8: nonsense values fail at load
    "log_every_zero": (["--set", "train.log_every=0"], r"train\.log_every=0 .* >= 1"),
    "negative_steps": (["--set", "train.steps=-3"], r"train\.steps=-3 .* >= 0"),
    "negative_every_steps": (["--set", "checkpoint.every_steps=-1"],
                             r"checkpoint\.every_steps=-1 .* >= 0"),
    "negative_keep": (["--set", "checkpoint.keep=-1"], r"checkpoint\.keep=-1 .* >= 0"),
    "infinite_learning_rate": (["--set", "optim.learning_rate=1e999"],
                               r"optim\.learning_rate=inf is not a finite number"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_leave_the_workdir_unchanged(case, wd, capsys):
    extra, pattern = REFUSALS[case]
    before = snapshot(wd)
    code, lines, out = run_cli(capsys, train_args(wd, *extra))
    assert code == 2, out[-3000:]
    assert len(lines) == 1 and "Traceback" not in out, out[-3000:]
    assert re.search(pattern, lines[0]), lines
    assert snapshot(wd) == before
    assert not os.path.exists(wd / ".lock")


def test_shape_mismatch_behind_the_guard_is_not_corruption(wd, capsys):
    """config.json deleted, then another shape: the checkpoints' own shapes stop the run;
    nothing is moved to corrupt_checkpoints and no config.json is written for them."""
    os.remove(wd / "config.json")
    before = snapshot(wd)
    code, lines, out = run_cli(capsys, train_args(wd, "--set", "model.d_ff=96"))
    assert code == 2 and len(lines) == 1 and "Traceback" not in out, out[-3000:]
    assert re.search(r"checkpoint step 4 .* other shapes or dtypes .* \[1, 32, 64\] float32.*"
                     r"\[1, 32, 96\] float32.*checkpoint\.init_from", lines[0]), lines
    assert snapshot(wd) == before and not os.path.exists(wd / "corrupt_checkpoints")


def test_config_file_with_an_error_names_file_and_line(wd, tmp_path, capsys):
    bad = tmp_path / "bad_config.py"
    bad.write_text("from t5lite.config import Config\n\n\ndef get_config():\n"
                   "    cfg = Config()\n    cfg.train.steps = stepz\n    return cfg\n")
    broken = tmp_path / "broken_config.py"
    broken.write_text("def get_config(:\n    pass\n")
    before = snapshot(wd)
    for path, pattern in ((bad, r"bad_config\.py:6: NameError: name 'stepz'"),
                          (broken, r"broken_config\.py:1: syntax error")):
        code, lines, out = run_cli(capsys, ["train", "--config", path, "--workdir", wd])
        assert code == 2 and len(lines) == 1 and "Traceback" not in out, out[-2000:]
        assert re.search(pattern, lines[0]), lines
    assert snapshot(wd) == before


# ---------------------------------------------------------------------------- lock (item 2)

HOLD = ("import sys, time\nfrom t5lite.store.workdir import WorkdirLock\n"
        "WorkdirLock(sys.argv[1]).acquire()\nprint('locked', flush=True)\ntime.sleep(120)\n")


def test_second_run_on_a_locked_workdir_refuses_naming_the_holder(wd, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(wd)], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(wd)
        code, lines, out = run_cli(capsys, train_args(wd))
        assert code == 2 and len(lines) == 1, out[-2000:]
        assert f"pid {holder.pid} on host " in lines[0] and "another --workdir" in lines[0]
        assert snapshot(wd) == before
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_of_a_dead_process_is_taken_over(wd, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (wd / ".lock").write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid,
                                          "started": "2026-01-01T00:00:00Z"}))
    before = snapshot(wd)
    code, lines, out = run_cli(capsys, train_args(wd))  # finished run: restores, trains 0 steps
    assert code == 0, out[-3000:]
    assert f"took over the lock of a run that is gone (pid {dead.pid}" in out
    assert snapshot(wd) == before and not os.path.exists(wd / ".lock")


# ---------------------------------------------------------------------------- item 1: flag


def test_safe_change_with_the_flag_keeps_the_old_config(wd, capsys):
    old, old_rows = (wd / "config.json").read_text(), metrics_rows(wd)
    before = snapshot(wd)
    code, lines, out = run_cli(capsys, train_args(wd, "--allow-config-change", steps=6))
    assert code == 0, out[-3000:]
    assert (wd / "config.1.json").read_text() == old
    assert json.loads((wd / "config.json").read_text())["train"]["steps"] == 6
    assert_kept(before, wd, metrics_upto=4, old_rows=old_rows)
    rows = [r for r in metrics_rows(wd) if r["split"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]


def test_diverged_run_resumes_with_a_lower_learning_rate_and_skips_batches(wd, capsys):
    """The usual recovery: resume from the last good checkpoint with a lower learning rate
    (and other optimizer / loss settings that leave the state's shapes alone), skipping the
    batches after it; every change is recorded with the step it applies from. Step 2 is the
    good one here: --resume-from 2 sets checkpoint 4 aside (moved whole, never deleted)."""
    old_rows, before = metrics_rows(wd), snapshot(wd)
    code, lines, out = run_cli(capsys, train_args(
        wd, "--allow-config-change", "--resume-from", "2", "--set", "optim.learning_rate=1e-3",
        "--set", "model.dropout_rate=0.05", "--set", "train.z_loss=0.0", "--set",
        "optim.warmup_steps=50", "--set", "train.skip_batches=2:3", steps=6))
    assert code == 0, out[-3000:]
    (stamp,) = os.listdir(wd / "set_aside")
    said = (f"t5lite: --resume-from 2: set aside checkpoint 4 (with its data state) -> "
            f"{wd / 'set_aside' / stamp}; move them back to undo\n")
    assert said in out and out.index(said) < out.index("resumed from"), out[-3000:]
    assert "resumed from" in out and "checkpoints/2" in out, out[-3000:]
    assert "skipped 3 training batches at step 2" in out
    later = {rel: d for rel, d in before.items()
             if rel.startswith(("checkpoints/4/", "data_state/4/"))}
    assert any(r.startswith("data_state/4/") for r in later), sorted(before)
    after = snapshot(wd)
    for rel, digest in later.items():  # the set-aside step is intact, byte for byte
        assert after[os.path.join("set_aside", stamp, rel)] == digest, rel
    assert_kept({k: v for k, v in before.items() if k not in later}, wd, metrics_upto=2,
                old_rows=old_rows)
    (row,) = [json.loads(x) for x in (wd / "config_history.jsonl").read_text().splitlines()]
    assert row["step"] == 2 and row["kept_as"] == "config.1.json"
    assert row["changes"]["optim.learning_rate"] == [1e-2, 1e-3]
    assert row["changes"]["train.skip_batches"] == ["", "2:3"]
    assert set(row["changes"]) == {"optim.learning_rate", "model.dropout_rate", "train.z_loss",
                                   "optim.warmup_steps", "train.skip_batches", "train.steps"}
    lr = {r["step"]: r["lr"] for r in metrics_rows(wd) if r["split"] == "train"}
    assert sorted(lr) == [1, 2, 3, 4, 5, 6], lr
    assert lr[2] == pytest.approx(1e-2) and lr[3] == pytest.approx(1e-3), lr


@pytest.mark.parametrize("extra, message", [
    (["--resume-from", "3"], "--resume-from 3: {wd}/checkpoints has no step 3; saved steps: "
     "2, 4"),
    (["--resume-from", "2", "--set", "optim.learning_rate=1e-3"],  # the guard first
     "{wd} was trained with another config"),
])
def test_resume_from_a_step_that_cannot_be_used_moves_nothing(wd, capsys, extra, message):
    before = snapshot(wd)
    code, lines, out = run_cli(capsys, train_args(wd, *extra))
    assert code == 2 and len(lines) == 1, out[-3000:]
    assert lines[0].startswith("t5lite: error: " + message.format(wd=wd)), lines
    assert not (wd / "set_aside").exists()
    assert snapshot(wd) == before


# ---------------------------------------------------------------------------- item 4: damage


def _damage_data_state(wd, how):
    d = wd / "data_state" / "4"
    if how == "deleted":
        shutil.rmtree(d)
    else:
        for f in os.listdir(d):
            if ".data-" in f:
                (d / f).write_bytes(b"\x00garbage" * 7)


@pytest.mark.parametrize("how", ["deleted", "garbage"])
def test_damaged_data_state_falls_back_to_the_previous_step(wd, capsys, how):
    ref = metrics_rows(wd)
    before = snapshot(wd)
    _damage_data_state(wd, how)
    code, lines, out = run_cli(capsys, train_args(wd))
    assert code == 0, out[-3000:]
    assert "checkpoint step 4" in out and "data iterator state" in out and "previous" in out
    before = {k: v for k, v in before.items() if not k.startswith("data_state/4")}
    assert_kept(before, wd, moved_step=4, metrics_upto=2, old_rows=ref)
    rows = {r["step"]: r for r in metrics_rows(wd) if r["split"] == "train"}
    assert sorted(rows) == [1, 2, 3, 4]  # steps 3, 4 trained again from step 2's data position
    for r in (r for r in ref if r["split"] == "train"):  # ... the same batches: same losses
        np.testing.assert_allclose(rows[r["step"]]["loss"], r["loss"], rtol=1e-5)
    assert sorted(os.listdir(wd / "checkpoints")) == ["2", "4"]


def test_torn_metrics_line_is_repaired(wd, capsys):
    rows = metrics_rows(wd)
    with open(wd / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "split": "tr')  # power loss mid-line
    before = snapshot(wd)
    code, lines, out = run_cli(capsys, train_args(wd))
    assert code == 0, out[-3000:]
    assert [r for r in metrics_rows(wd) if r["split"] != "goodput"] == [
        r for r in rows if r["split"] != "goodput"]  # (a rerun logs its goodput summary)
    assert (wd / "metrics.jsonl.damaged").read_text() == '{"step": 5, "split": "tr\n'
    assert "moved to" in out and "metrics.jsonl.damaged" in out
    assert_kept({k: v for k, v in before.items() if k != "metrics.jsonl"}, wd)


# ---------------------------------------------------------------------------- item 7: inputs


def test_training_data_missing_is_one_line_without_a_traceback(wd, data_dir, tmp_path,
                                                                monkeypatch, capsys):
    empty = tmp_path / "data"
    shutil.copytree(data_dir, empty)
    shutil.rmtree(empty / "corpus")
    monkeypatch.setenv("T5LITE_DATA_DIR", str(empty))
    before = snapshot(wd)
    code, lines, out = run_cli(capsys, train_args(wd))
    assert code == 2 and len(lines) == 1, out[-3000:]
    assert "Traceback" not in out and "corpus" in lines[0], out[-3000:]
    assert snapshot(wd) == before


def test_infer_input_and_output_checks(wd, tmp_path, capsys):
    binary = tmp_path / "in.bin"
    binary.write_bytes(b"good line\nsecond \xff\xfe line\n")
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"ok\n\x00\x01\x02\n")
    text = tmp_path / "in.txt"
    text.write_text("hello\n")
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    for args, pattern in (
            (["--input", binary], r"line 2 is not UTF-8 text"),
            (["--input", nul], r"line 2 contains NUL bytes"),
            (["--input", text, "--output", outdir], r"--output .* is a directory")):
        code, lines, out = run_cli(capsys, ["infer", "--checkpoint", wd, *args])
        assert code == 2 and len(lines) == 1 and "Traceback" not in out, out[-2000:]
        assert re.search(pattern, lines[0]), lines
    assert os.listdir(outdir) == []


# ---------------------------------------------------------------------------- item 3: SIGTERM


def test_sigterm_saves_at_the_next_step_and_exits_75(wd, capsys):
    """SIGTERM mid-run (a real signal to this process, from a watcher thread): a checkpoint
    at the next step boundary, exit 75 and the agreed line; the same command then resumes."""
    import threading
    args = train_args(wd, "--allow-config-change", steps=60)
    seen = {}

    def watch():
        deadline = time.time() + 300
        while time.time() < deadline:
            if os.path.exists(wd / "metrics.jsonl") and any(
                    r["step"] >= 6 for r in metrics_rows(wd)):
                seen["before"] = snapshot(wd)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.01)

    # outside train() (which installs its own handler) a stray SIGTERM must not kill pytest
    old = signal.signal(signal.SIGTERM, lambda *a: None)
    try:
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        code, lines, out = run_cli(capsys, args)
        watcher.join()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert code == 75 and len(lines) == 1, out[-3000:]
    step = int(lines[0].split("preempted at step ")[1].split(":")[0])
    assert lines[0] == (f"t5lite: preempted at step {step}: checkpoint saved; rerun the same "
                        "command to resume")
    assert 6 <= step < 60 and str(step) in os.listdir(wd / "checkpoints")
    assert not [d for d in os.listdir(wd / "checkpoints") if "tmp" in d]
    assert os.path.isdir(wd / "data_state" / str(step))
    assert max(r["step"] for r in metrics_rows(wd)) == step
    assert_kept({k: v for k, v in seen["before"].items() if k != "metrics.jsonl"}, wd)
    assert not os.path.exists(wd / ".lock")
    code, lines, out = run_cli(capsys, args)
    assert code == 0, out[-3000:]
    assert f"resumed from {wd}/checkpoints/{step}" in out
    assert [r["step"] for r in metrics_rows(wd) if r["split"] == "train"] == list(range(1, 61))


# ---------------------------------------------------------------------------- file modes
# Root ignores file modes; as root these runs drop the capabilities that let it (setpriv).

NO_DAC = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
          "--bounding-set=-dac_override,-dac_read_search"]


def _run_obeying_file_modes(args, data_dir):
    prefix = NO_DAC if os.geteuid() == 0 else []
    if prefix and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file modes cannot be tested")
    return subprocess.run(prefix + [sys.executable, "-m", "t5lite.cli", *map(str, args)],
                          cwd=ROOT, env=_env(data_dir), capture_output=True, text=True,
                          timeout=300)


def test_read_only_workdir_is_one_line(wd, data_dir):
    subprocess.run(["chmod", "-R", "a-w", wd], check=True)
    try:
        before = snapshot(wd)
        r = _run_obeying_file_modes(train_args(wd), data_dir)
    finally:
        subprocess.run(["chmod", "-R", "u+w", wd], check=True)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("t5lite:")]
    assert len(lines) == 1 and "is not writable" in lines[0], r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert snapshot(wd) == before


def test_unreadable_newest_checkpoint_falls_back(wd, data_dir):
    before = snapshot(wd)
    os.chmod(wd / "checkpoints" / "4", 0)
    try:
        r = _run_obeying_file_modes(train_args(wd), data_dir)
    finally:
        for d in os.listdir(wd / "checkpoints"):
            os.chmod(wd / "checkpoints" / d, 0o755)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "checkpoint step 4" in out and "unreadable" in out and "previous" in out, out[-3000:]
    assert f"resumed from {wd}/checkpoints/2" in out
    moved = [d for d in os.listdir(wd / "checkpoints") if d.startswith("4.")]
    assert len(moved) == 1 and moved[0].startswith("4.unreadable.")  # renamed, not lost
    after = snapshot(wd)
    for rel, digest in before.items():
        if rel.startswith("checkpoints/4/"):
            rel = rel.replace("checkpoints/4/", f"checkpoints/{moved[0]}/", 1)
        if rel.startswith(("checkpoints", "config", "data_state/2")):
            history = wd / "config_history.jsonl"  # what rewrote config.json, if it was
            assert after[rel] == digest, (rel, history.exists() and history.read_text())
    assert sorted(os.listdir(wd / "checkpoints"))[:2] == ["2", "4"]  # 4 trained again


# ---------------------------------------------------------------------------- disk full


@pytest.fixture
def small_disk(tmp_path):
    """A small tmpfs (root only): a real ENOSPC."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode:
        pytest.skip("needs root to mount a small tmpfs (a real full disk)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_disk_full_says_so_and_the_last_checkpoint_is_intact(trained, small_disk, capsys):
    wd = small_disk / "run"
    shutil.copytree(trained, wd, ignore=shutil.ignore_patterns("tensorboard"))
    st = os.statvfs(small_disk)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    # room for a config and a few metrics lines, not for another checkpoint
    subprocess.run(["mount", "-o", f"remount,size={used // 1024 + 96}k", str(small_disk)],
                   check=True)
    before = snapshot(wd)
    code, lines, out = run_cli(capsys, train_args(wd, "--allow-config-change", steps=8))
    assert code == 2, out[-3000:]
    assert len(lines) == 1 and "no space left on device" in lines[0], out[-3000:]
    assert "last checkpoint (step 4) is intact" in lines[0]
    after = snapshot(wd)
    for rel, digest in before.items():
        if rel.startswith(("checkpoints", "data_state/2", "data_state/4")):
            assert after[rel] == digest, rel
    assert after["config.1.json"] == before["config.json"]
    # space again: the same command resumes, and no half-written save is left behind
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    code, lines, out = run_cli(capsys, train_args(wd, "--allow-config-change", steps=8))
    assert code == 0, out[-3000:]
    assert not [d for d in os.listdir(wd / "checkpoints") if "tmp" in d]
    assert sorted(os.listdir(wd / "checkpoints"), key=int)[-1] == "8"


# ---------------------------------------------------------------------------- issue 35 item 9


def test_fallback_restore_exits_clean_and_goodput_counts_from_the_command(wd, data_dir):
    """The newest checkpoint's array data overwritten: the run falls back to step 2 with one
    warning, and orbax's other failed shard reads leave no asyncio "Task exception was never
    retrieved" records (in the run, or at exit). The command runs as `bash -c 'sleep 3 &&
    exec t5lite ...'` (as `pip install ... && t5lite ...` does: t5lite in the shell's own
    process, which started 3 s earlier): a `t5lite` command's goodput wall clock starts with
    the command (not the shell), and importing JAX and TensorFlow is start-up too."""
    for f in (wd / "checkpoints" / "4" / "params" / "ocdbt.process_0" / "d").iterdir():
        f.write_bytes(b"garbage")
    cmd = " ".join(shlex.quote(str(a)) for a in [sys.executable, "-m", "t5lite.cli",
                                                 *train_args(wd)])
    t0 = time.time()
    r = subprocess.run(["bash", "-c", f"sleep 3 && exec {cmd}"], cwd=ROOT, env=_env(data_dir),
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "checkpoint step 4" in out and "falling back to the previous one" in out, out[-3000:]
    assert "never retrieved" not in out and "Traceback" not in out, out[-3000:]
    run = json.loads((wd / "goodput.json").read_text())["runs"][-1]
    assert run["first_step"] == 2 and t0 + 3 <= run["started"] < t0 + 4, (run, t0)
    assert run["seconds"]["startup"] > 1.0  # the imports at least
