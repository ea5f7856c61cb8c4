"""The reliability cases that need no trained workdir (tests/test_reliability.py holds those
that start from one): lock races and leases, the config guard's rules, inputs that are not
t5lite's, the data position across process counts, a mistaken first run, and GCS."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from t5lite.errors import UserError
from t5lite.store import gcs
from test_gcs import bucket, emulator  # noqa: F401  (fixtures: the GCS emulator)
from reliability_helpers import ROOT, run_cli, snapshot, train_args


# ---------------------------------------------------------------------------- refusals


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


# ---------------------------------------------------------------------------- item 1: config guard


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


# ---------------------------------------------------------------------------- item 7: inputs


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


# ---------------------------------------------------------------------------- issue 35 item 9: GCS


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
