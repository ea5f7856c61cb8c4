"""gs:// workdirs against a real GCS JSON-API server (tests/gcs_emulator.py: fake-gcs-server on
a loopback port), reached by each library through its documented endpoint setting: every
object a run writes (orbax arrays and metadata, metrics, TensorBoard, config, data state, the
lock) goes over the GCS protocol, nothing through a local folder standing in for a bucket."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from gcs_emulator import Emulator
from t5lite.errors import UserError
from t5lite.store import gcs
from t5lite.store.workdir import WorkdirLock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def emulator():
    server = Emulator()  # not stopped here: it ends with this process (gcs_emulator.py)
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    import fsspec.config
    had_conf = "gcs" in fsspec.config.conf
    # what the CLI does at start (and paths.abspath of a gs:// path): before gcsfs is
    # imported, which reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT then
    gcs.configure()
    import gcsfs
    gcs.client.cache_clear()
    gcsfs.GCSFileSystem.clear_instance_cache()
    yield server
    gcs.client.cache_clear()
    gcsfs.GCSFileSystem.clear_instance_cache()
    if not had_conf:
        fsspec.config.conf.pop("gcs", None)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_buckets = iter(range(10**6))


@pytest.fixture
def bucket(emulator):
    return emulator.make_bucket(f"t5lite-{os.getpid()}-{next(_buckets)}")


def objects(url) -> dict:
    """name under `url` -> bytes, read with google-cloud-storage (not the library that wrote)."""
    name, prefix = gcs.split(url)
    return {b.name[len(prefix):].lstrip("/"): b.download_as_bytes()
            for b in gcs.client().list_blobs(name, prefix=prefix)}


def test_every_library_of_a_run_reaches_the_emulator(bucket):
    """epath (gcsfs), tensorstore, tensorboardX and google-cloud-storage all read and write
    the emulator's objects: what one writes the others see."""
    from etils import epath
    import tensorstore as ts
    p = epath.Path(bucket) / "a" / "config.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text('{"x": 1}')
    gcs.blob(f"{bucket}/a/other.txt").upload_from_string(b"from the client")
    name, _ = gcs.split(bucket)
    kv = ts.KvStore.open({"driver": "gcs", "bucket": name, "path": "ts/"}).result()
    kv.write("key", b"from tensorstore").result()
    from t5lite.monitor.writers import _summary_writer_cls
    tb = _summary_writer_cls()(f"{bucket}/tb")
    tb.add_scalar("train/loss", 1.5, 1)
    tb.close()
    got = objects(bucket)
    assert got["a/config.json"] == b'{"x": 1}' and got["ts/key"] == b"from tensorstore"
    assert sorted(c.name for c in (epath.Path(bucket) / "a").iterdir()) == [
        "config.json", "other.txt"]
    assert (epath.Path(bucket) / "a" / "other.txt").read_text() == "from the client"
    assert any(k.startswith("tb/events.out.tfevents") and b"train/loss" in v
               for k, v in got.items())


def test_append_keeps_every_earlier_line(bucket):
    """gcsfs opens "a" as "w" (every earlier metrics line would go): appends compose."""
    url = f"{bucket}/run/metrics.jsonl"
    for i in range(3):
        gcs.append(url, f"line {i}\n".encode())
    assert objects(bucket) == {"run/metrics.jsonl": b"line 0\nline 1\nline 2\n"}


def _race(n, make):
    """n threads call make() at once. -> (winners, UserError messages)."""
    start, won, refused = threading.Barrier(n), [], []

    def one():
        start.wait()
        try:
            won.append(make())
        except UserError as e:
            refused.append(str(e))
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return won, refused


def test_lock_race_on_gcs_exactly_one_wins(bucket):
    """Runs started together on one gs:// workdir: create-if-absent (ifGenerationMatch=0)
    lets exactly one through; the others get the one-line refusal naming the holder."""
    run = f"{bucket}/run"
    won, refused = _race(6, lambda: WorkdirLock(run, lease_seconds=30).acquire())
    assert len(won) == 1 and len(refused) == 5
    assert all(re.fullmatch(rf"workdir {run} is in use by another t5lite train \(pid "
                            rf"{os.getpid()} on host .*heartbeat.*rerun then\)", m)
               for m in refused)
    record = json.loads(objects(run)[".lock"])
    assert record["token"] == won[0].token
    won[0].release()
    assert ".lock" not in objects(run)


def test_lock_stale_record_is_taken_over_by_exactly_one(bucket):
    """A dead run's record (no heartbeat for longer than its lease, another host): racing
    takers each write with ifGenerationMatch=<the generation they read>; one wins."""
    run = f"{bucket}/run"
    gcs.blob(f"{run}/.lock").upload_from_string(json.dumps({
        "host": "old-worker", "pid": 4242, "started": "2026-01-01T00:00:00Z",
        "heartbeat": time.time() - 100, "lease_seconds": 10, "token": "old"}))
    won, refused = _race(5, lambda: WorkdirLock(run, lease_seconds=30).acquire())
    try:
        assert len(won) == 1 and len(refused) == 4
        assert won[0].took_over["host"] == "old-worker"
        assert "took over the lock of a run that is gone (pid 4242 on old-worker" in \
            won[0].takeover_line()
        assert json.loads(objects(run)[".lock"])["token"] == won[0].token
    finally:
        won[0].release()


def test_lock_torn_record_is_dated_by_the_objects_update_time(bucket):
    """A record that does not parse (a torn write of an older t5lite) has no heartbeat: the
    object's server-side update time dates it, fresh -> refused, a lease later -> taken."""
    run = f"{bucket}/run"
    gcs.blob(f"{run}/.lock").upload_from_string(b'{"host": "old-wor')
    with pytest.raises(UserError, match="in use by another t5lite train"):
        WorkdirLock(run, lease_seconds=1.0).acquire()
    time.sleep(1.1)
    lock = WorkdirLock(run, lease_seconds=1.0).acquire()
    try:
        assert "no heartbeat for 1s" in lock.takeover_line()
    finally:
        lock.release()
    assert ".lock" not in objects(run)


def test_lock_holder_that_lost_its_record_stops_beating_and_leaves_it(bucket, capsys):
    """A holder whose record another run replaced finds out at its next beat (its
    precondition fails), warns, and its release does not delete the other run's record."""
    run = f"{bucket}/run"
    lock = WorkdirLock(run, lease_seconds=0.6).acquire()
    other = json.dumps({"host": "new-worker", "pid": 7, "token": "theirs",
                        "heartbeat": time.time(), "lease_seconds": 60})
    gcs.blob(f"{run}/.lock").upload_from_string(other)
    deadline = time.time() + 10
    while lock.lost_to is None and time.time() < deadline:
        time.sleep(0.05)
    lock.release()
    assert lock.lost_to["host"] == "new-worker"
    assert "was taken over by pid 7 on host new-worker" in capsys.readouterr().err
    assert objects(run)[".lock"] == other.encode()


# ---------------------------------------------------------------------------- a whole run

BASE = [
    "model.vocab_size=768", "model.d_model=32", "model.num_heads=4", "model.head_dim=8",
    "model.d_ff=64", "model.num_encoder_layers=1", "model.num_decoder_layers=1",
    "data.feature_lengths={'inputs': 32, 'targets': 8}", "data.batch_size=8",
    "train.log_every=1", "train.eval_every=0", "train.eval_steps=0",
    "train.prepare_data=()", "checkpoint.every_steps=2", "checkpoint.keep=3",
]
HOLD = ("import sys, time\nfrom t5lite.store.workdir import WorkdirLock\n"
        "WorkdirLock(sys.argv[1], lease_seconds=30).acquire()\n"
        "print('locked', flush=True)\ntime.sleep(120)\n")


def train(workdir, steps, *extra):
    from t5lite.cli import main as cli
    args = ["train", "--config", "configs/quickstart.py", "--workdir", workdir]
    for item in BASE + [f"train.steps={steps}"]:
        args += ["--set", item]
    return cli.main(args + list(extra))


def rows(run):
    return [json.loads(line) for line in objects(run)["metrics.jsonl"].decode().splitlines()]


def test_train_on_gcs_writes_resumes_and_is_refused_while_locked(bucket, data_dir, emulator,
                                                                 capsys):
    """`t5lite train --workdir gs://...`: checkpoints, data state, metrics, TensorBoard and
    config reach the bucket; a second invocation resumes from them (earlier metrics lines
    kept); a run while another process holds the lock is refused and writes nothing."""
    run = f"{bucket}/run"
    logs = f"{run}/worker_logs/20260101T000000Z/worker-0.log"  # launch/tpu_job.sh's copies
    gcs.blob(logs).upload_from_string(b"=== t5lite job on worker 0\n")
    assert train(run, 4) == 0
    names = set(objects(run))
    assert {"config.json", "goodput.json", "worker_logs/20260101T000000Z/worker-0.log",
            "checkpoints/2/params/_METADATA", "checkpoints/4/opt/_METADATA",
            "data_state/4/shard_0_of_1.index"} <= names
    assert any(n.startswith("tensorboard/events.out.tfevents") for n in names)
    first = rows(run)
    assert [r["step"] for r in first if r["split"] == "train"] == [1, 2, 3, 4]
    capsys.readouterr()

    assert train(run, 6, "--allow-config-change") == 0
    assert f"resumed from {run}/checkpoints/4\n" in capsys.readouterr().out
    second = rows(run)
    assert second[:len(first) - 1] == first[:-1]  # the goodput summary line may go on
    assert [r["step"] for r in second if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert {"checkpoints/6/params/_METADATA", "data_state/6/shard_0_of_1.index"} <= set(
        objects(run))

    before = {k: v for k, v in objects(run).items() if k != ".lock"}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, run], cwd=ROOT, text=True,
                              env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "locked"
        capsys.readouterr()
        assert train(run, 8, "--allow-config-change") == 2
        err = capsys.readouterr().err
        assert re.search(rf"workdir {run} is in use by another t5lite train \(pid "
                         rf"{holder.pid} on host ", err)
    finally:
        holder.kill()
        holder.wait()
    after = {k: v for k, v in objects(run).items() if k != ".lock"}
    assert after == before


def test_checkpointer_on_gcs_skips_a_step_with_damaged_data_state(bucket):
    """Checkpointer on gs:// with a tf.data iterator: each step's iterator state goes up
    beside its arrays; a step whose state is garbage is moved to corrupt_checkpoints/ (gcsfs
    moves) and the previous one resumes at its exact position."""
    import jax.numpy as jnp
    import tensorflow as tf
    from t5lite import config as config_lib
    from t5lite.store.checkpointing import Checkpointer
    from t5lite.train.state import TrainState
    run = f"{bucket}/run"
    cfg = config_lib.CheckpointConfig(every_steps=1, keep=3, async_save=False)

    def state(step):
        return TrainState(step=jnp.int32(step), params={"w": jnp.full((4,), step, jnp.float32)},
                          opt_state={"m": jnp.zeros((4,))})
    ckpt, it = Checkpointer(run, cfg), iter(tf.data.Dataset.range(100))
    for step in (1, 2):
        next(it)
        ckpt.save(step, state(step), it)
    ckpt.close()
    assert {"data_state/1/process_0.index", "data_state/2/process_0.index"} <= set(objects(run))
    gcs.blob(f"{run}/data_state/2/process_0.index").upload_from_string(b"not an index")
    ckpt, it = Checkpointer(run, cfg), iter(tf.data.Dataset.range(100))
    restored, step = ckpt.restore_latest(state(0), it)
    ckpt.close()
    assert step == 1 and float(restored.params["w"][0]) == 1.0 and int(next(it)) == 1
    names = set(objects(run))
    assert not any(n.startswith("checkpoints/2/") for n in names)
    assert any(re.fullmatch(r"corrupt_checkpoints/2\.\d+/params/_METADATA", n) for n in names)
    assert any(re.fullmatch(r"corrupt_checkpoints/2\.\d+\.data_state/process_0\.index", n)
               for n in names)


def test_gcsfs_imported_before_configure_serves_gs_with_its_core_class():
    """gcsfs reads its zonal-bucket flag at import: imported first (by another library, a
    notebook, an earlier test), it served gs:// with the class whose probe an emulator never
    answers (a minute per bucket; the suite's GCS tests failed in a full run). configure()
    registers the core class whatever the order."""
    code = ("import gcsfs, fsspec\n"
            "assert fsspec.get_filesystem_class('gs') is not gcsfs.core.GCSFileSystem\n"
            "from t5lite.store import gcs\n"
            "gcs.configure()\n"
            "print(fsspec.get_filesystem_class('gs') is gcsfs.core.GCSFileSystem)")
    env = {k: v for k, v in os.environ.items() if k != "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"}
    proc = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr[-2000:]
