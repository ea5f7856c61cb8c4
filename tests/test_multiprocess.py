"""Multi-host training without hosts: 2 JAX processes x 4 CPU devices on 127.0.0.1 (through
launch/local_multiprocess.py) train exactly like 1 process x 8 devices, and resume exactly,
also on another number of processes.

Each process reads its own shard of the data (seqio ShardInfo), feeds it to
make_array_from_process_local_data, and only process 0 writes metrics; checkpoints are written
by both processes together. Unpacked, unshuffled data and no dropout make the global batch
hold the same examples in both layouts (in another row order), so the losses agree to float
rounding. A second, fast test: when one host cannot use the newest checkpoint, every host
falls back to the previous one together.
"""

import json
import os
import random
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "launch", "local_multiprocess.py")

OVERRIDES = [
    "model.vocab_size=640", "model.dropout_rate=0.0", "model.num_encoder_layers=1",
    "model.num_decoder_layers=1", "data.mixture_or_task=sentiment",
    "data.feature_lengths={'inputs': 32, 'targets': 4}", "data.batch_size=8", "data.pack=False",
    "data.shuffle=False", "optim.name=adamw", "optim.learning_rate=0.003",
    "optim.schedule=constant", "optim.warmup_steps=0", "train.log_every=1", "train.eval_steps=0",
    "checkpoint.every_steps=2", "checkpoint.async_save=False",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A small data dir in the CONTRACTS.md layout: synthetic sentences, labels and a
    SentencePiece model trained on them (up to 300 pieces, + 100 sentinels in seqio)."""
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("data")
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghiklmnoprstuw") for _ in range(rng.randint(2, 7)))
             for _ in range(300)]

    def sentence():
        return " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))

    (root / "corpus").mkdir()
    text = [sentence() for _ in range(2000)]
    (root / "corpus" / "train.txt").write_text("\n".join(text) + "\n")
    (root / "corpus" / "validation.txt").write_text("\n".join(text[:50]) + "\n")
    (root / "finetune" / "sentiment").mkdir(parents=True)
    for split, n in (("train", 256), ("validation", 32), ("test", 32)):
        rows = [f"{sentence()}\t{rng.choice(['negative', 'positive'])}" for _ in range(n)]
        (root / "finetune" / "sentiment" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    (root / "vocab").mkdir()
    spm.SentencePieceTrainer.train(
        input=str(root / "corpus" / "train.txt"), model_prefix=str(root / "vocab" / "t5lite_sp8k"),
        vocab_size=300, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False,
        minloglevel=2)
    return str(root)


def _env(data_dir, devices):
    env = dict(os.environ, T5LITE_DATA_DIR=data_dir, JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _train_args(workdir, steps):
    args = ["train", "--config", "configs/t5_1_1_tiny.py", "--workdir", str(workdir),
            "--allow-config-change"]  # the resumed runs train on to more steps
    for item in OVERRIDES + [f"train.steps={steps}"]:
        args += ["--set", item]
    return args


def train_one_process(data_dir, workdir, steps):
    r = subprocess.run([sys.executable, "-m", "t5lite.cli", *_train_args(workdir, steps)],
                       cwd=ROOT, env=_env(data_dir, 8), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def train_two_processes(data_dir, workdir, steps):
    r = subprocess.run([sys.executable, LAUNCHER, "--num-processes", "2",
                        "--devices-per-process", "4", "--timeout", "500", "--",
                        "t5lite", *_train_args(workdir, steps)],
                       cwd=ROOT, env=_env(data_dir, 4), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def train_losses(workdir) -> dict:
    """step -> loss from metrics.jsonl; fails if a step was logged twice (two writers)."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))
            if line.strip()]
    steps = [r["step"] for r in rows if r["split"] == "train"]
    assert len(steps) == len(set(steps)), f"steps logged more than once: {steps}"
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


@pytest.mark.slow
def test_two_processes_match_one_and_resume(data_dir, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    train_one_process(data_dir, one, steps=6)
    expected = train_losses(one)
    assert sorted(expected) == [1, 2, 3, 4, 5, 6]

    out = train_two_processes(data_dir, two, steps=4)
    assert "[0]" in out and "[1]" in out
    first = train_losses(two)
    assert sorted(first) == [1, 2, 3, 4]
    assert sorted(os.listdir(two / "checkpoints")) == ["2", "4"]
    assert sorted(os.listdir(two / "data_state" / "4")) == sorted(
        f"shard_{i}_of_2.{ext}" for i in (0, 1) for ext in ("index", "data-00000-of-00001"))

    # resume on another process count (1, then 2 again): the data goes on from the same
    # global position (the 2 data shards, read by one process, then by two)
    out = train_one_process(data_dir, two, steps=5)
    assert "resumed from" in out and "checkpoints/4" in out
    out = train_two_processes(data_dir, two, steps=6)  # a third invocation continues at 5
    assert "resumed from" in out and "checkpoints/5" in out
    resumed = train_losses(two)
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6]
    assert resumed[5] != resumed[4]  # it trained on
    for step, loss in expected.items():
        assert resumed[step] == pytest.approx(loss, rel=2e-5), (step, resumed, expected)
    assert expected[6] < expected[1]  # and it learns


RESTORE_WORKER = r'''
import json, sys
import jax
import numpy as np
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from t5lite.config import CheckpointConfig
from t5lite.store import checkpointing
from t5lite.train.trainer import TrainState

pid = jax.process_index()
mesh = Mesh(np.array(jax.devices()), ("x",))
sharding = NamedSharding(mesh, P("x"))

def state(value):
    local = np.full((2,), value, np.float32)
    w = jax.make_array_from_process_local_data(sharding, local)
    step = jax.make_array_from_process_local_data(NamedSharding(mesh, P()),
                                                  np.array(value, np.int32))
    return TrainState(step=step, params={"w": w}, opt_state={"m": w})

ck = checkpointing.Checkpointer(sys.argv[3], CheckpointConfig(async_save=False))
for step in (1, 2):
    ck.save(step, state(step))
ck.wait()
if pid == 1:  # a read error on this host only (its disk, its shard of step 2)
    real = ck.manager.restore
    def restore(step, *a, **k):
        out = real(step, *a, **k)  # orbax's restore is collective: take part, then fail
        if step == 2:
            raise OSError("simulated host-local read error")
        return out
    ck.manager.restore = restore
restored, step = ck.restore_latest(state(0))
local = [np.asarray(s.data) for s in restored.params["w"].addressable_shards]
print(json.dumps({"pid": pid, "step": step, "w": float(local[0][0]),
                  "state_step": int(restored.step)}), flush=True)
ck.close()
'''


def test_hosts_agree_on_the_checkpoint_when_one_cannot_read_the_newest(tmp_path):
    """A read error on one host only quarantines that step for every host: all restore the
    previous one (else they would train on from different states)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(RESTORE_WORKER)
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT,
               XLA_FLAGS="--xla_force_host_platform_device_count=1")
    procs = [subprocess.Popen([sys.executable, str(script), f"127.0.0.1:{port}", str(i),
                               str(tmp_path / "wd")], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    try:  # without agreement the hosts restore different steps and hang in a barrier
        outs = [p.communicate(timeout=600) for p in procs]  # jax + orbax start-up under load
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-2000:] + err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [(r["step"], r["w"], r["state_step"]) for r in results] == [(1, 1.0, 1)] * 2
    assert "another host could not read" in outs[0][0] and "simulated" in outs[1][0]
    moved = os.listdir(tmp_path / "wd" / "corrupt_checkpoints")
    assert len(moved) == 1 and moved[0].startswith("2.")
    assert sorted(os.listdir(tmp_path / "wd" / "checkpoints")) == ["1"]


@pytest.mark.slow
def test_sigterm_on_one_host_saves_on_all_and_exits_75(data_dir, tmp_path):
    """A preemption notice (SIGTERM) to one of two processes: through JAX's preemption sync
    point both save the same step (each its data shard) and both exit 75 with the agreed
    line."""
    import signal
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wd = tmp_path / "wd"
    args = _train_args(wd, 400) + ["--set", "checkpoint.every_steps=1000"]

    def start():
        return [subprocess.Popen(
            [sys.executable, "-m", "t5lite.cli", *args, "--set", "mesh.multihost=true"],
            cwd=ROOT, env=dict(_env(data_dir, 4), T5LITE_COORDINATOR=f"127.0.0.1:{port}",
                               T5LITE_NUM_PROCESSES="2", T5LITE_PROCESS_ID=str(i)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]

    procs = start()
    try:
        deadline = time.time() + 500
        while not (wd / "metrics.jsonl").exists() or len(train_losses(wd)) < 3:
            assert all(p.poll() is None for p in procs) and time.time() < deadline
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    lines = [[x for x in err.splitlines() if x.startswith("t5lite: preempted")]
             for _, err in outs]
    assert [p.returncode for p in procs] == [75, 75], [e[-2000:] for _, e in outs]
    assert lines[0] == lines[1] and len(lines[0]) == 1, lines
    step = int(lines[0][0].split("preempted at step ")[1].split(":")[0])
    assert 3 <= step < 400 and os.listdir(wd / "checkpoints") == [str(step)]
    assert sorted(os.listdir(wd / "data_state" / str(step))) == sorted(
        f"shard_{i}_of_2.{ext}" for i in (0, 1) for ext in ("index", "data-00000-of-00001"))
    assert max(train_losses(wd)) == step
