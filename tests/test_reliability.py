"""The catalogue of ways a hostile but ordinary user can hurt a run (issue "never lose a run").

Each case starts from a copy of one trained tiny workdir (checkpoints 2 and 4, metrics lines
1-4), does one thing to it, and asserts the exit code, a one-line message that names the fix,
and that every checkpoint, metrics line and config that existed is still there (hash of every
file before / after; a damaged step may only have moved to corrupt_checkpoints/, unchanged).
In-process through t5lite.cli.main.main where possible; subprocesses only for signals, lock races
and what needs another user (root ignores file modes).
"""

import hashlib
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
from t5lite.errors import UserError
from t5lite.store import gcs
from test_gcs import bucket, emulator  # noqa: F401  (fixtures: the GCS emulator)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = [
    "model.vocab_size=768", "model.d_model=32", "model.num_heads=4", "model.head_dim=8",
    "model.d_ff=64", "model.num_encoder_layers=1", "model.num_decoder_layers=1",
    "data.feature_lengths={'inputs': 32, 'targets': 8}", "data.batch_size=8",
    "train.steps=4", "train.log_every=1", "train.eval_every=0", "train.eval_steps=0",
    "train.prepare_data=()", "checkpoint.every_steps=2", "checkpoint.keep=3",
]


def train_args(workdir, *extra, steps=None):
    args = ["train", "--config", "configs/quickstart.py", "--workdir", str(workdir)]
    for item in BASE + ([f"train.steps={steps}"] if steps else []):
        args += ["--set", item]
    return args + list(extra)


def run_cli(capsys, args):
    """-> (exit code, stderr lines that are t5lite's own, all output)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    mine = [line for line in err.splitlines() if line.startswith("t5lite:")]
    return code, mine, out + err


def _in_flight(rel: str) -> bool:
    """A temporary file of a write in flight in a live run, gone a moment later, not history:
    our atomic writes (*.tmp), tf.train.Checkpoint's sharded save (<prefix>_temp/ with
    *.tempstate* parts: the data state) and orbax's *.orbax-checkpoint-tmp* directories."""
    parts = rel.split(os.sep)
    return (parts[-1].endswith(".tmp") or ".tempstate" in parts[-1]
            or any(p.endswith("_temp") or "orbax-checkpoint-tmp" in p for p in parts[:-1]))


def snapshot(workdir) -> dict:
    """relative path -> sha256 of every file (TensorBoard event files, the lock and in-flight
    temp files aside);
    "rows" -> the metrics records."""
    out = {}
    for dirpath, _, files in os.walk(workdir):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), workdir)
            if rel.startswith("tensorboard") or rel == ".lock" or _in_flight(rel):
                continue
            with open(os.path.join(dirpath, f), "rb") as fh:
                data = fh.read()
            # goodput.json is the run's time accounting: a resume appends its run to "runs"
            out[rel] = (json.loads(data)["runs"] if rel == "goodput.json"
                        else hashlib.sha256(data).hexdigest())
    return out


def rows_upto(workdir, step):
    return [r for r in metrics_rows(workdir) if r["step"] <= step]


def metrics_rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def assert_kept(before: dict, workdir, moved_step=None, metrics_upto=None, old_rows=None):
    """Every file of `before` is still there, byte for byte: in place, or (moved_step) under
    corrupt_checkpoints/<step>.<time>[.data_state]/. metrics.jsonl may only have lost lines
    after `metrics_upto` (the step it resumed from) and gained new ones."""
    after = snapshot(workdir)
    moved = {}
    if moved_step is not None:
        for rel, digest in after.items():
            parts = rel.split(os.sep)
            if parts[0] == "corrupt_checkpoints" and parts[1].startswith(f"{moved_step}."):
                sub = "data_state" if parts[1].endswith(".data_state") else "checkpoints"
                moved[os.path.join(sub, str(moved_step), *parts[2:])] = digest
    for rel, digest in before.items():
        if rel == "metrics.jsonl" and metrics_upto is not None:
            continue
        if rel == "config.json" and "config.1.json" in after and "config.1.json" not in before:
            assert after["config.1.json"] == digest, "the previous config was not kept"
            continue
        if rel == "goodput.json" and isinstance(after.get(rel), list):
            new = after[rel][:len(digest)]  # earlier runs kept; the last may have gone on
            assert new[:-1] == digest[:-1] and [(r["started"], r["first_step"]) for r in new] \
                == [(r["started"], r["first_step"]) for r in digest], "goodput.json lost runs"
            continue
        now = moved.get(rel) if moved_step is not None and rel.startswith((
            f"checkpoints/{moved_step}/", f"data_state/{moved_step}/")) else after.get(rel)
        assert now == digest, f"{rel} changed or vanished"
    if metrics_upto is not None:
        assert rows_upto(workdir, metrics_upto) == [r for r in old_rows
                                                    if r["step"] <= metrics_upto]
    return after


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


def _env(data_dir, devices=1):
    return dict(os.environ, T5LITE_DATA_DIR=data_dir, JAX_PLATFORMS="cpu",
                TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT,
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")


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


def test_workdir_that_is_a_file(tmp_path, capsys, monkeypatch):
    """Refused on the argument itself, first: with nothing prepared (an empty data dir), the
    line is still about the workdir, not the data the run would have read."""
    monkeypatch.setenv("T5LITE_DATA_DIR", str(tmp_path / "empty_data"))
    f = tmp_path / "notadir"
    f.write_text("precious")
    code, lines, out = run_cli(capsys, train_args(f))
    assert code == 2 and len(lines) == 1, out[-2000:]
    assert "is a file, not a directory" in lines[0]
    assert f.read_text() == "precious"


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


def test_lock_race_has_exactly_one_winner(tmp_path):
    """Eight processes lock one workdir at the same moment: one holds it, seven refuse."""
    script = ("import sys, time\nfrom t5lite.store.workdir import WorkdirLock\n"
              "from t5lite.errors import UserError\n"
              "while time.time() < float(sys.argv[2]): pass\n"
              "try:\n    WorkdirLock(sys.argv[1]).acquire(); print('won', flush=True)\n"
              "except UserError as e:\n    print('lost', e, flush=True)\n"
              "time.sleep(3)\n")
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(start)],
                              env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                              text=True) for _ in range(8)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert sum(o.startswith("won") for o in outs) == 1, outs
    assert all(o.startswith("won") or "is in use by another t5lite train" in o for o in outs)


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


LEASE_HOLD = (
    "import socket, sys, time\nsocket.gethostname = lambda: 'old-worker'  # another VM\n"
    "from t5lite.store.workdir import WorkdirLock\n"
    "WorkdirLock(sys.argv[1], lease_seconds=1.2, use_flock=False).acquire()\n"
    "print('locked', flush=True)\ntime.sleep(120)\n")


def test_lease_lock_a_preempted_holder_on_another_host_is_taken_over(tmp_path, capsys):
    """The gs:// lock (a lease, here on a local path): a live holder on another host keeps it
    by its heartbeat and is refused at once; once it is killed (its slice preempted and
    recreated under other host names) a rerun waits for the lease to run out and takes the
    lock over, naming the old holder."""
    from t5lite.errors import UserError
    from t5lite.store.workdir import WorkdirLock
    holder = subprocess.Popen([sys.executable, "-c", LEASE_HOLD, str(tmp_path)], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        time.sleep(2.0)  # longer than the lease: only the heartbeat keeps it
        with pytest.raises(UserError, match=rf"pid {holder.pid} on host old-worker.*last "
                           r"heartbeat \ds ago.*expires 1s after its last heartbeat"):
            WorkdirLock(str(tmp_path), lease_seconds=60, use_flock=False).acquire()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.6)  # the dead holder has missed beats (every 0.2 s) but its lease is not over
    last_beat = json.loads((tmp_path / ".lock").read_text())["heartbeat"]
    capsys.readouterr()
    lock = WorkdirLock(str(tmp_path), lease_seconds=1.2, use_flock=False).acquire()
    assert time.time() >= last_beat + 1.2  # not before the lease ran out
    assert re.search(rf"no heartbeat for \ds \(pid {holder.pid} on host old-worker\): "
                     r"waiting up to \ds", capsys.readouterr().out)
    assert lock.took_over["pid"] == holder.pid and lock.took_over["host"] == "old-worker"
    assert re.search(rf"took over the lock of a run that is gone \(pid {holder.pid} on "
                     r"old-worker, .*no heartbeat for \ds\)", lock.takeover_line())
    try:  # this holder's own heartbeat keeps the next one out
        time.sleep(1.6)
        with pytest.raises(UserError, match=f"pid {os.getpid()} on host "):
            WorkdirLock(str(tmp_path), lease_seconds=1.2, use_flock=False).acquire()
    finally:
        lock.release()
    assert os.listdir(tmp_path) == []  # the lock is gone, and no heartbeat temp file is left


def test_lease_lock_dead_pid_on_this_host_is_taken_over_at_once(tmp_path):
    from t5lite.store.workdir import WorkdirLock
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(json.dumps({
        "host": os.uname().nodename, "pid": dead.pid, "started": "2026-01-01T00:00:00Z",
        "heartbeat": time.time(), "lease_seconds": 600}))
    with WorkdirLock(str(tmp_path), use_flock=False) as lock:
        assert lock.took_over["pid"] == dead.pid
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert not os.path.exists(tmp_path / ".lock")


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


def test_config_guard_lets_through_what_leaves_the_state_shapes_alone(tmp_path):
    from t5lite import config as config_lib
    from t5lite.errors import UserError
    from t5lite.store import workdir as workdir_lib
    for name, change, allowed in (
            ("adafactor", {"optim.learning_rate": 1e-3, "optim.schedule": "cosine"}, True),
            ("adafactor", {"train.grad_accum_steps": 2, "optim.eps": 1e-6}, True),
            ("adafactor", {"optim.clip_grad_norm": 1.0}, False),
            ("adafactor", {"optim.weight_decay": 0.1}, False),
            ("adamw", {"optim.weight_decay": 0.1, "optim.b2": 0.95}, True),
            ("adamw", {"optim.clip_grad_norm": 1.0}, False),
            ("adamw", {"optim.name": "adafactor"}, False)):
        cfg = config_lib.Config()
        cfg.optim.name = name
        wd = str(tmp_path / f"{name}-{len(os.listdir(tmp_path))}")
        workdir_lib.write_config(cfg, wd)
        changed = config_lib.replace(cfg, change)
        with pytest.raises(UserError, match="--allow-config-change" if allowed else
                           "cannot continue under these changes"):
            workdir_lib.check_config(changed, wd)
        if allowed:
            assert workdir_lib.check_config(changed, wd, allow_change=True) is True
        else:
            with pytest.raises(UserError, match="cannot continue"):
                workdir_lib.check_config(changed, wd, allow_change=True)
    # a clipping threshold changed (not switched on or off) keeps the layout
    cfg = config_lib.replace(config_lib.Config(), {"optim.clip_grad_norm": 1.0})
    workdir_lib.write_config(cfg, str(tmp_path / "clip"))
    assert workdir_lib.check_config(config_lib.replace(cfg, {"optim.clip_grad_norm": 0.5}),
                                    str(tmp_path / "clip"), allow_change=True)


def test_the_non_finite_step_message_names_a_rerun_the_guard_accepts(tmp_path):
    import re as re_
    from t5lite import config as config_lib
    from t5lite.store import workdir as workdir_lib
    for clip in (0.0, 1.0):
        cfg = config_lib.replace(config_lib.Config(), {"optim.clip_grad_norm": clip})
        wd = str(tmp_path / f"clip{clip}")
        workdir_lib.write_config(cfg, wd)
        hint = workdir_lib.recovery_hint(cfg, 1200)
        assert "--allow-config-change" in hint and "train.skip_batches=1200:N" in hint, hint
        assert ("switching optim.clip_grad_norm on needs a new --workdir" in hint) == (not clip)
        sets = dict(kv.split("=") for kv in re_.findall(r"--set (\S+=[^\s,)]+)", hint)
                    if not kv.startswith("checkpoint."))
        sets["train.skip_batches"] = sets["train.skip_batches"].replace("N", "200")
        assert workdir_lib.check_config(config_lib.replace(cfg, [f"{k}={v}" for k, v in
                                                                 sets.items()]), wd, True)
    assert "--allow-config-change" not in workdir_lib.recovery_hint(cfg, 0)  # nothing saved


def test_skip_batches_drops_n_batches_only_when_resuming_at_its_step():
    import tensorflow as tf
    from t5lite import config as config_lib
    from t5lite.errors import UserError
    from t5lite.train import data
    cfg = config_lib.Config()
    cfg.train.skip_batches, cfg.train.steps = "3:2", 10
    for start, first in ((3, 2), (0, 0), (5, 0)):
        it, said = iter(tf.data.Dataset.range(10)), []
        assert data.skip_batches(cfg, it, start, info=said.append) == (2 if first else 0)
        assert int(next(it)) == first
        # a run starting before step 3 would train through it unskipped: it says so
        assert ("is not applied" in " ".join(said)) == (start < 3), said
    cfg.train.skip_batches = "3:20"
    with pytest.raises(UserError, match="ran out after skipping 10 of 20"):
        data.skip_batches(cfg, iter(tf.data.Dataset.range(10)), 3)
    for bad in ("3", "a:b", "3:0", "-1:2", "1:2:3"):
        with pytest.raises(UserError, match="give \"S:N\""):
            data.parse_skip(bad)


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


def test_convert_import_of_a_malformed_model_dir(tmp_path, capsys):
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text('{"architectures": ["T5ForConditionalGeneration"], ')
    (src / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    code, lines, out = run_cli(capsys, ["convert", "import", src, tmp_path / "dst"])
    assert code == 2 and len(lines) == 1 and "is not valid JSON" in lines[0], out[-2000:]
    (src / "config.json").write_text('{"architectures": ["T5ForConditionalGeneration"]}')
    code, lines, out = run_cli(capsys, ["convert", "import", src, tmp_path / "dst"])
    assert code == 2 and len(lines) == 1, out[-2000:]
    assert "model.safetensors is not a readable safetensors weights file" in lines[0]
    assert not os.path.exists(tmp_path / "dst" / "params")


def test_quickstart_rerun_the_other_way_names_its_own_fix(tmp_path, data_dir, capsys):
    """quickstart has no --allow-config-change / --set: a workdir made with (without) --fast
    is refused naming the quickstart command that resumes it, before anything is written."""
    from t5lite.cli import quickstart
    from t5lite.store import workdir as workdir_lib
    from t5lite.errors import UserError
    for made_fast in (True, False):
        qs = tmp_path / f"qs_{made_fast}"
        for cfg, stage in quickstart.stage_configs(str(qs), data_dir, made_fast, False):
            workdir_lib.write_config(cfg, stage)  # what a run of that kind leaves
        before = snapshot(qs)
        again = " --fast" if made_fast else ""
        with pytest.raises(UserError, match=(
                rf"{qs} holds a quickstart run made {'with' if made_fast else 'without'} "
                rf"--fast: rerun `t5lite quickstart --workdir {qs}{again}` to resume it")):
            quickstart.run(str(qs), fast=not made_fast, data_dir=data_dir, prepare=False)
        assert snapshot(qs) == before
    # through the CLI: one line, exit 2
    code, lines, out = run_cli(capsys, ["quickstart", "--workdir", tmp_path / "qs_True"])
    assert code == 2 and len(lines) == 1 and "Traceback" not in out, out[-2000:]
    assert "--allow-config-change" not in lines[0] and "--fast` to resume it" in lines[0]
    # a config edited since (neither way): another workdir, in quickstart's terms
    path = tmp_path / "qs_False" / "pretrain" / "config.json"
    edited = json.loads(path.read_text())
    edited["model"]["d_ff"] = 96
    path.write_text(json.dumps(edited))
    with pytest.raises(UserError, match=r"pretrain was trained with another config \(model"
                       r"\.d_ff 96 -> 384\): give `t5lite quickstart` another --workdir"):
        quickstart.run(str(tmp_path / "qs_False"), data_dir=data_dir, prepare=False)


def test_ablation_stages_use_the_trainers_config_diff(tmp_path):
    """`t5lite ablate` refuses a stage workdir started with another config through the
    trainer's diff: the keys with old -> new values; placement keys (mesh, remat) and keys
    a config.json from an older t5lite lacks (their defaults) are no difference."""
    from t5lite import ablations
    from t5lite.ablations import runner
    from t5lite import config as config_lib
    from t5lite.store import workdir as workdir_lib
    from t5lite.errors import UserError

    def stage(*overrides):
        cfg = config_lib.load_config("quickstart", ["train.prepare_data=()", *overrides])
        return ablations.Stage("pretrain", "quickstart", str(tmp_path / "pretrain"),
                               list(overrides), cfg)

    workdir_lib.write_config(stage().cfg, str(tmp_path / "pretrain"))
    path = tmp_path / "pretrain" / "config.json"
    older = json.loads(path.read_text())
    del older["checkpoint"]["lock_lease_seconds"]  # a field added since
    path.write_text(json.dumps(older))
    runner.check_same_config(stage())
    runner.check_same_config(stage("mesh.data=1", "model.remat=full"))
    with pytest.raises(UserError, match=r"pretrain was started with a different config "
                       r"\(train\.seed 0 -> 1, train\.steps 300 -> 8\)\. Use another "
                       r"--workdir, or delete that directory to redo the stage"):
        runner.check_same_config(stage("train.seed=1", "train.steps=8"))


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


# ---------------------------------------------------------------------------- item 6


def _global_batches(make, num_shards, processes, n, restore=None, save=None, save_after=0):
    """n global batches as `processes` processes would read them (rows in process order);
    the iterator states go to `save` after `save_after` batches."""
    from t5lite.tasks import pipeline
    its = [pipeline.ShardedBatches(make, num_shards, 8, p, processes) for p in range(processes)]
    for it in its:
        if restore:
            it.restore_state(restore)
    out = []
    for i in range(n):
        if save and i == save_after:
            for it in its:
                it.save_state(save)
        parts = [next(it) for it in its]
        out.append({k: np.concatenate([np.asarray(x[k]) for x in parts]) for k in parts[0]})
    return out


def test_data_position_survives_another_process_count(data_dir, tmp_path):
    """Read 3 global batches on 2 processes, save, continue on 1 or on 4 processes (4 > the 2
    shards: two processes split each shard's rows): the next global batches are those the
    uninterrupted run reads, so nothing is repeated or skipped and the data does not depend
    on the process count."""
    from t5lite.errors import UserError
    from t5lite.tasks import pipeline

    def make(shard_info, batch_size):  # packed span corruption: packing state is resumed too
        return pipeline.get_dataset("corpus_span_corruption", {"inputs": 32, "targets": 8},
                                    "encoder_decoder", batch_size, shuffle=True, seed=1,
                                    shard_info=shard_info)

    state = str(tmp_path / "state")
    ref = _global_batches(make, 2, 2, 5, save=state, save_after=3)
    assert pipeline.saved_num_shards(str(tmp_path)) is None
    for after in (1, 4):
        rest = _global_batches(make, 2, after, 2, restore=state)
        for got, want in zip(rest, ref[3:]):
            for k in want:
                np.testing.assert_array_equal(got[k], want[k], err_msg=f"2 -> {after}: {k}")
    assert not np.array_equal(ref[3]["encoder_input_tokens"], ref[4]["encoder_input_tokens"])
    with pytest.raises(UserError, match="2 shards, which 3 processes cannot split evenly"):
        pipeline.ShardedBatches(make, 2, 12, 0, 3)


def test_unread_shard_failures_are_collected_without_asyncio_tracebacks(caplog):
    """A failed asyncio task that nobody awaited, kept alive only by a reference cycle (as
    orbax's other shard reads are after the first one fails), is dropped silently inside
    progress.quiet_failed_reads: whether the garbage collector finds it mid-read (an automatic
    collection before the failure is even caught, as CI saw) or at the end, after the caller
    marked the failure. Outside the block asyncio logs it (the test can fail)."""
    import asyncio
    import gc
    import logging
    import weakref
    from t5lite import progress

    async def read():
        raise ValueError("bad shard")

    def leak():
        loop = asyncio.new_event_loop()
        task = loop.create_task(read())
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()
        holder = {"task": task}
        holder["self"] = holder  # only the garbage collector frees it
        return weakref.ref(task)

    def asyncio_records():
        return [r for r in caplog.records if r.name == "asyncio"]

    caplog.set_level(logging.INFO)
    gc.disable()
    try:
        with progress.quiet_failed_reads():
            mid = leak()
            gc.collect()  # an automatic collection mid-read, before anything is marked
        with progress.quiet_failed_reads() as reads:
            end = leak()
            reads.failed = True  # collected by the block's own collection at the end
        assert mid() is None and end() is None
        assert not asyncio_records(), asyncio_records()
        leak()
        gc.collect()  # the same cycle outside the block: asyncio logs it
        assert any("never retrieved" in r.getMessage() for r in asyncio_records())
    finally:
        gc.enable()


# ---------------------------------------------------------------------------- issue 35 item 4
# A mistaken run stops with one line before it writes anything: mistakes found from the config
# stop before the workdir is touched; those found later (the data, the first step) take back
# what the run wrote, so the corrected command is not refused as a change of config.


MISTAKES = {
    "profile_steps": (["--set", "train.profile_steps=5"], r"train\.profile_steps='5'"),
    "init_from": (["--set", "checkpoint.init_from={tmp}/pretrained"],
                  r"pretrained is not a t5lite checkpoint"),
    "unknown_task": (["--set", "data.mixture_or_task=no_such_task"],
                     r"no task or mixture named 'no_such_task'"),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_a_mistaken_run_leaves_no_workdir(case, data_dir, tmp_path, capsys):
    extra, pattern = MISTAKES[case]
    extra = [a.format(tmp=tmp_path) for a in extra]
    code, lines, out = run_cli(capsys, train_args(tmp_path / "runs" / "new", *extra))
    assert code == 2 and len(lines) == 1 and "Traceback" not in out, out[-3000:]
    assert re.search(pattern, lines[0]), lines
    assert os.listdir(tmp_path) == []  # neither the workdir nor the parent made for it


def test_a_run_stopped_at_its_first_step_takes_back_its_start_up_files(data_dir, tmp_path,
                                                                       capsys):
    """An update that overflows at step 1: config.json, TensorBoard's events and the empty
    checkpoints/ are removed again; what the workdir held before stays."""
    wd = tmp_path / "run"
    (wd / "worker_logs").mkdir(parents=True)
    (wd / "worker_logs" / "worker-0.log").write_text("queued\n")
    code, lines, out = run_cli(capsys, train_args(wd, "--set", "optim.learning_rate=1e38"))
    assert code == 2 and len(lines) == 1, out[-3000:]
    assert "step 1 was not finite" in lines[0] and "learning_rate" in lines[0], lines
    assert os.listdir(wd) == ["worker_logs"]
    assert (wd / "worker_logs" / "worker-0.log").read_text() == "queued\n"


@pytest.mark.parametrize("evidence", ["metrics.jsonl", "checkpoints/2", "goodput.json",
                                      "earlier metrics.jsonl", None])
def test_start_up_files_stay_once_a_step_was_logged_or_saved(tmp_path, evidence):
    """Trained output, this run's or an earlier run's (a failed resume), keeps every file."""
    from t5lite.store import startup
    wd = tmp_path / "run"
    wd.mkdir()
    (wd / "notes.txt").write_text("the user's")
    if evidence == "earlier metrics.jsonl":
        evidence = "metrics.jsonl"
        (wd / evidence).write_text('{"step": 1}\n')
    writes = startup.StartupWrites(str(wd))
    writes.begin()
    (wd / "config.json").write_text("{}")
    (wd / "tensorboard").mkdir()
    (wd / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\x00")
    (wd / "checkpoints").mkdir()
    if evidence == "checkpoints/2":
        (wd / evidence).mkdir()
    elif evidence:
        (wd / evidence).write_text('{"step": 1}\n')
    writes.undo()
    writes.remove_if_new()  # the workdir was there before: it stays
    kept = ["checkpoints", "config.json", "notes.txt", "tensorboard"] + (
        [evidence] if evidence in ("metrics.jsonl", "goodput.json") else [])
    assert sorted(os.listdir(wd)) == (sorted(kept) if evidence else ["notes.txt"])


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


def test_resume_from_sets_aside_on_gcs(bucket):
    """gs:// has no folders and renames nothing: the later steps' objects are copied to
    set_aside/<time>/ and then deleted (GCS emulator, the protocol the run speaks)."""
    from test_gcs import objects
    from t5lite.store import set_aside
    wd = f"{bucket}/run"
    for rel in ("checkpoints/2/params/a", "checkpoints/4/params/a", "checkpoints/4/opt/b",
                "data_state/4/process_0.index", "checkpoints/6/params/a", "config.json"):
        gcs.blob(f"{wd}/{rel}").upload_from_string(rel.encode())
    with pytest.raises(UserError, match="has no step 3; saved steps: 2, 4, 6"):
        set_aside.set_aside_after(wd, 3)
    line = set_aside.set_aside_after(wd, 2)
    (stamp,) = {name.split("/")[1] for name in objects(wd) if name.startswith("set_aside/")}
    assert line.endswith(f"checkpoints 4, 6 (with their data state) -> {wd}/set_aside/{stamp}; "
                         "move them back to undo"), line
    assert objects(wd) == {rel: rel.encode() for rel in ("checkpoints/2/params/a",
                                                          "config.json")} | {
        f"set_aside/{stamp}/{rel}": rel.encode() for rel in (
            "checkpoints/4/params/a", "checkpoints/4/opt/b", "data_state/4/process_0.index",
            "checkpoints/6/params/a")}
    assert set_aside.saved_steps(wd) == [2]
