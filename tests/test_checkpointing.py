"""Checkpoints: kill -9 and resume through the CLI gives the same losses; restore onto another
mesh; a corrupt newest checkpoint falls back to the previous one; params-only loading and
partial restore (init_from)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from t5lite.store import checkpointing
from t5lite.mesh import partitioning
from t5lite.train import optim, trainer
from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite.peft import build_model
from train_helpers import tf_iterator, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def _cfg(steps=6):
    cfg = tiny_config()
    cfg.mesh = config_lib.MeshConfig(data=2, fsdp=4)
    cfg.train.steps, cfg.train.eval_steps = steps, 0
    cfg.checkpoint.every_steps, cfg.checkpoint.keep = 2, 5
    return cfg


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """6 steps on 8 devices (data=2 x fsdp=4), checkpoints at 2, 4, 6."""
    wd = str(tmp_path_factory.mktemp("ref") / "run")
    trainer.train(_cfg(), wd, train_iter=tf_iterator(_cfg()))
    return wd


def _copy_up_to(src, dst, step):
    shutil.copytree(src, dst)
    for sub in ("checkpoints", "data_state"):
        for name in os.listdir(os.path.join(dst, sub)):
            if name.isdigit() and int(name) > step:
                shutil.rmtree(os.path.join(dst, sub, name))


def test_restore_onto_one_and_two_devices(reference, tmp_path):
    _, saved = checkpointing.load_params(reference, step=2)
    cfg1 = _cfg()
    cfg1.mesh = config_lib.MeshConfig(data=1)
    model = build_model(cfg1.model)
    mesh1 = partitioning.make_mesh(cfg1.mesh, jax.devices()[:1])
    tx = optim.make_optimizer(cfg1.optim, cfg1.train.steps)
    abstract, _, _ = trainer.abstract_train_state(cfg1, model, mesh1, tx)
    wd = str(tmp_path / "two")
    _copy_up_to(reference, wd, 2)
    state, step = checkpointing.Checkpointer(wd, cfg1.checkpoint).restore_latest(abstract)
    assert step == 2 and int(state.step) == 2
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(saved)):
        assert a.sharding.device_set == {jax.devices()[0]}
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # continue on 2 devices (fsdp=2): steps 3 and 4 match the 8-device run
    cfg2 = _cfg(steps=4)
    cfg2.mesh = config_lib.MeshConfig(data=1, fsdp=2)
    trainer.train(cfg2, wd, train_iter=tf_iterator(cfg2), devices=jax.devices()[:2],
                  allow_config_change=True)
    ref, got = train_losses(reference), train_losses(wd)
    np.testing.assert_allclose([got[3], got[4]], [ref[3], ref[4]], rtol=1e-4)


def _corrupt(step_dir):
    n = 0
    for dirpath, _, files in os.walk(os.path.join(step_dir, "params")):
        for f in files:
            if not f.startswith("_"):  # keep orbax's metadata, damage the array data
                with open(os.path.join(dirpath, f), "r+b") as fh:
                    fh.truncate(max(os.path.getsize(os.path.join(dirpath, f)) // 3, 1))
                n += 1
    assert n


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(reference, tmp_path, capsys):
    wd = str(tmp_path / "corrupt")
    shutil.copytree(reference, wd)
    _corrupt(os.path.join(wd, "checkpoints", "6"))
    os.makedirs(os.path.join(wd, "checkpoints", "8.orbax-checkpoint-tmp-1"))  # half-written
    trainer.train(_cfg(), wd, train_iter=tf_iterator(_cfg()))
    out = capsys.readouterr().out
    assert "checkpoint step 6" in out and "unreadable" in out and "previous" in out
    assert os.listdir(os.path.join(wd, "corrupt_checkpoints"))[0].startswith("6.")
    ref, got = train_losses(reference), train_losses(wd)
    np.testing.assert_allclose([got[5], got[6]], [ref[5], ref[6]], rtol=1e-6)
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2", "4", "6"]


def test_load_params_and_init_from(reference, tmp_path):
    cfg, last = checkpointing.load_params(reference)
    assert cfg == _cfg()
    _, step4 = checkpointing.load_params(os.path.join(reference, "checkpoints", "4"))
    assert not np.allclose(jax.tree.leaves(last)[0], jax.tree.leaves(step4)[0])
    # a params-only dir (what `t5lite convert import` writes)
    pdir = tmp_path / "params_only"
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(str(pdir / "params"), last)
    (pdir / "config.json").write_text(json.dumps(config_lib.to_dict(cfg)))
    _, again = checkpointing.load_params(str(pdir))
    jax.tree.map(np.testing.assert_array_equal, again, last)
    with pytest.raises(UserError, match="not a t5lite checkpoint"):
        checkpointing.load_params(str(tmp_path))

    # partial restore: params from the checkpoint, a fresh optimizer (lr 0: params unchanged)
    ft = _cfg(steps=1)
    ft.checkpoint.init_from, ft.optim.learning_rate = str(pdir), 0.0
    wd = str(tmp_path / "ft")
    trainer.train(ft, wd, train_iter=tf_iterator(ft))
    _, tuned = checkpointing.load_params(wd)
    jax.tree.map(np.testing.assert_array_equal, tuned, last)
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["1"]

    # a new head keeps its init, extra checkpoint params are reported, shapes must match
    head = _cfg()
    head.model.num_classes = 3
    model = build_model(head.model)
    mesh = partitioning.make_mesh(head.mesh)
    state, _ = trainer.create_train_state(head, model, mesh,
                                          optim.make_optimizer(head.optim, 1))
    said = []
    merged = checkpointing.merge_params(state.params, dict(last, old_head={"w": np.zeros(2)}),
                                        announce=said.append)
    assert any("keep their fresh init" in s and "class" in s for s in said)
    assert any("unused by this model" in s and "old_head" in s for s in said)
    shared = [k for k in merged if k in last]
    assert shared
    for k in shared:
        jax.tree.map(np.testing.assert_array_equal, merged[k], last[k])
    bad = jax.tree.map(lambda x: np.zeros((x.shape[0] + 1,) + x.shape[1:], x.dtype), last)
    with pytest.raises(UserError, match="init_from: parameter .* has shape"):
        checkpointing.merge_params(state.params, bad)
    # a same-size kernel that is not a join of the other's dims (a transpose) is refused
    swap = jax.tree.map(lambda x: np.zeros(x.shape[::-1], x.dtype), last)
    with pytest.raises(UserError, match="init_from: parameter .* has shape"):
        checkpointing.merge_params(state.params, swap)


@pytest.mark.parametrize("a, b, joined", [
    ((24, 2048, 32, 64), (24, 2048, 2048), True), ((32, 64, 2048), (2048, 2048), True),
    ((4, 1, 6), (4, 6), True), ((2, 3, 4), (2, 3, 4), True), ((4, 6), (6, 4), False),
    ((5, 7), (7, 5), False), ((2, 12), (6, 4), False), ((2, 3), (2, 3, 5), False)])
def test_joined_shapes(a, b, joined):
    assert checkpointing.joined_shapes(a, b) == joined == checkpointing.joined_shapes(b, a)


CLI_OVERRIDES = [
    "model.vocab_size=768", "model.d_model=32", "model.num_heads=4", "model.head_dim=8",
    "model.d_ff=64", "model.num_encoder_layers=1", "model.num_decoder_layers=1",
    "data.feature_lengths={'inputs': 32, 'targets': 8}", "data.batch_size=8",
    "train.steps=12", "train.log_every=1", "train.eval_every=0", "train.eval_steps=0",
    "train.prepare_data=()", "checkpoint.every_steps=4", "checkpoint.keep=3",
]


def _cli(workdir, data_dir):
    cmd = [sys.executable, "-m", "t5lite.cli", "train", "--config", "configs/quickstart.py",
           "--workdir", workdir]
    for o in CLI_OVERRIDES:
        cmd += ["--set", o]
    env = dict(os.environ, T5LITE_DATA_DIR=data_dir, JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT,
               XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return cmd, env


def test_kill_and_resume_through_the_cli_gives_the_same_losses(tmp_path, monkeypatch):
    """T5 span corruption on a small prepared data dir: SIGKILL after a checkpoint, rerun the
    same command, and the per-step losses equal an uninterrupted run's (run in this process on
    one device, like the CLI's: the same programs on the same data)."""
    import tasks_testdata
    data = tasks_testdata.make_data_dir(str(tmp_path / "data"))
    monkeypatch.setenv("T5LITE_DATA_DIR", data)
    full = str(tmp_path / "full")
    cfg = config_lib.load_config("configs/quickstart.py", CLI_OVERRIDES)
    trainer.train(cfg, full, devices=jax.devices()[:1])

    killed = str(tmp_path / "killed")
    cmd, env = _cli(killed, data)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not os.path.isdir(os.path.join(killed, "checkpoints", "4")):
        assert proc.poll() is None and time.time() < deadline, "run ended before step 4"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    before = train_losses(killed)
    assert max(before) < 12, "killed too late to test anything"
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr
    want, got = train_losses(full), train_losses(killed)
    assert sorted(got) == list(range(1, 13))
    np.testing.assert_allclose([got[s] for s in range(1, 13)], [want[s] for s in range(1, 13)],
                               rtol=1e-6)
    assert want[12] < want[1]


def _old_params_only_dir(path, cfg, params, metadata=None):
    """The params-only layout exactly as the writers before checkpointing.save_params_dir
    produced it (convert.save_params_dir / TrainEvaluator._save / peft.save_peft): open() /
    write_text JSON files beside an orbax StandardSave of params/."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_lib.to_dict(cfg), f, indent=2)
    for name, value in (metadata or {}).items():
        with open(os.path.join(path, name), "w") as f:
            json.dump(value, f, indent=2)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(os.path.join(path, "params"), params)
        ckptr.wait_until_finished()


def test_params_only_dir_one_writer_reads_old_dirs(tmp_path):
    cfg = tiny_config()
    params = {"encoder": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)},
              "lora_b": np.full((3,), 0.5, np.float32)}
    # a dir written by the old code still loads, with its metadata
    old = str(tmp_path / "old")
    _old_params_only_dir(old, cfg, params, {"metrics.json": {"step": 3, "acc": 1.5}})
    got_cfg, got = checkpointing.load_params(old)
    assert got_cfg == cfg
    jax.tree.map(np.testing.assert_array_equal, got, params)
    assert checkpointing.read_metadata(old, "metrics.json") == {"step": 3, "acc": 1.5}
    assert checkpointing.read_metadata(old, "peft_only.json") is None

    # the one writer: the same files, readable by the same reader
    new = checkpointing.save_params_dir(str(tmp_path / "new"), cfg, params,
                                        {"metrics.json": {"step": 3, "acc": 1.5}})
    assert sorted(os.listdir(new)) == sorted(os.listdir(old)) == [
        "config.json", "metrics.json", "params"]
    assert (json.load(open(os.path.join(new, "config.json")))
            == json.load(open(os.path.join(old, "config.json"))))
    jax.tree.map(np.testing.assert_array_equal, checkpointing.load_params(new)[1], params)

    # never overwritten by mistake; replaced on purpose (best/, peft/<step>)
    with pytest.raises(UserError, match="already exists"):
        checkpointing.save_params_dir(new, cfg, params)
    twice = jax.tree.map(lambda x: 2 * x, params)
    checkpointing.save_params_dir(new, cfg, twice, {"metrics.json": {"step": 4}}, overwrite=True)
    jax.tree.map(np.testing.assert_array_equal, checkpointing.load_params(new)[1], twice)
    assert checkpointing.read_metadata(new, "metrics.json") == {"step": 4}


def test_peft_dirs_through_the_one_writer_and_reader(tmp_path):
    """peft.save_peft's dirs (config.json + peft_only.json + params/ of the trained subset)
    read through checkpointing, and the same dir written by save_params_dir loads in
    peft.load_peft: the interface t5lite/peft can write and read its files through."""
    import flax.linen as nn
    from t5lite import peft
    from t5lite.models import dummy_batch
    cfg = config_lib.load_config("bert_tiny", ["model.peft.lora_rank=2"])
    batch = dummy_batch(cfg.model, 1, {"inputs": 8})
    base = nn.meta.unbox(build_model(cfg.model).init(jax.random.key(0), batch,
                                                     deterministic=True)["params"])
    trained = jax.tree_util.tree_map_with_path(
        lambda p, v: v + 0.5 if "lora" in jax.tree_util.keystr(p) else v, base)
    old = str(tmp_path / "old")
    peft.save_peft(old, cfg, trained)  # today's writer
    got_cfg, subset = checkpointing.load_params(old)
    meta = checkpointing.read_metadata(old, peft.PEFT_MARKER)
    assert got_cfg == cfg and any("lora_b" in p for p in meta["paths"])
    new = checkpointing.save_params_dir(str(tmp_path / "new"), cfg, subset,
                                        {peft.PEFT_MARKER: meta}, overwrite=True)
    assert sorted(os.listdir(new)) == sorted(os.listdir(old))
    for path in (old, new):
        loaded_cfg, params = peft.load_peft(path, base)
        assert loaded_cfg == cfg
        jax.tree.map(np.testing.assert_array_equal, params, trained)


def test_failed_reads_of_a_reported_step_leave_no_asyncio_records(caplog, tmp_path):
    """orbax's other failed shard reads of a step reported unreadable, freed whenever (after
    the restore, at exit): asyncio's "Task exception was never retrieved" record is dropped;
    the same failure of a path not reported is still logged (the filter can fail)."""
    import asyncio
    import gc
    import logging
    from t5lite.store import failed_reads

    def leak(path):
        async def read():
            try:
                raise ValueError(f'OUT_OF_RANGE: Error reading "x/0.0" in OCDBT database at '
                                 f'local file "{path}/params/": bad byte range')
            except ValueError as e:
                raise Exception("Encountered error while reading array index") from e
        loop = asyncio.new_event_loop()
        task = loop.create_task(read())
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()
        del task  # freed now, long after any read block

    caplog.set_level(logging.INFO)
    failed_reads.reported(str(tmp_path / "checkpoints" / "4"))
    leak(tmp_path / "checkpoints" / "4")
    gc.collect()
    assert not [r for r in caplog.records if r.name == "asyncio"]
    leak(tmp_path / "checkpoints" / "40")  # a prefix is not a match: "4/" vs "40/"
    gc.collect()
    assert any("never retrieved" in r.getMessage() for r in caplog.records
               if r.name == "asyncio")


def test_pending_reads_of_a_reported_step_freed_later_are_not_printed(monkeypatch, tmp_path):
    """A read still pending when its event loop closed, freed later: closing its coroutine
    turns GeneratorExit into orbax's read error, an unraisable exception naming the step's
    dir. Dropped for a reported step, passed on for any other."""
    import asyncio
    import gc
    import sys
    from t5lite.store import failed_reads

    def leak(path):
        async def read():
            try:
                await asyncio.sleep(3600)
            except GeneratorExit as e:
                raise Exception(f"Encountered error while reading array index: "
                                f"'path': '{path}/params/'") from e
        loop = asyncio.new_event_loop()
        task = loop.create_task(read())
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()  # the read stays pending
        task._log_destroy_pending = False  # (not what this test is about)
        del task, loop
        gc.collect()

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    failed_reads.reported(str(tmp_path / "checkpoints" / "6"))
    leak(tmp_path / "checkpoints" / "6")
    assert seen == []
    leak(tmp_path / "checkpoints" / "2")
    assert [str(tmp_path / "checkpoints" / "2") in str(u.exc_value) for u in seen] == [True]
