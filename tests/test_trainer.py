"""The train step and the loop on synthetic batches: gradient accumulation equals one big
batch; logs, checkpoints and exact resume; NaN stop keeping the last good checkpoint."""

import json
import os

import jax
import numpy as np
import pytest

from t5lite.store import checkpointing
from t5lite.mesh import partitioning
from t5lite.train import optim, trainer
from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite.models import build_model
from train_helpers import steps_per_accumulation, synthetic_batches, tf_iterator, tiny_config
from numerics import assert_trees_close_at_scale


def read_metrics(workdir, split="train"):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r for r in rows if r["split"] == split}


@pytest.mark.parametrize("arch", ["decoder_only"])
def test_grad_accumulation_equals_one_big_batch(arch):
    cfg = tiny_config(arch, batch_size=32, lr=1.0)
    cfg.optim.eps = 1.0  # Adam's first update ~ lr * g / (|g| + 1): compares the gradients
    cfg.mesh = config_lib.MeshConfig(data=2, fsdp=4)
    batch = synthetic_batches(cfg, 1)[0]
    # uneven real-token counts per micro-batch: normalisers must come from the full batch
    batch["decoder_loss_weights"][::3, 5:] = 0
    params0, out = steps_per_accumulation(cfg, (1, 4), batch)
    (m1, p1), (m4, p4) = out[1], out[4]
    for key in ("loss", "accuracy", "grad_norm", "num_tokens"):
        np.testing.assert_allclose(m4[key], m1[key], rtol=2e-5, err_msg=key)
    assert_trees_close_at_scale(p4, p1, rtol=1e-5)
    assert not np.allclose(jax.tree.leaves(p1)[0], jax.tree.leaves(params0)[0])


def test_train_loop_logs_checkpoints_and_resumes_exactly(tmp_path):
    cfg = tiny_config(dropout=0.1)
    cfg.train.steps, cfg.train.eval_every = 6, 3
    cfg.checkpoint.every_steps, cfg.checkpoint.keep = 2, 2
    full = str(tmp_path / "full")
    final = trainer.train(cfg, full, train_iter=tf_iterator(cfg),
                          eval_iter_fn=lambda: tf_iterator(cfg, seed=1))
    train_rows, eval_rows = read_metrics(full), read_metrics(full, "eval")
    assert sorted(train_rows) == [1, 2, 3, 4, 5, 6] and sorted(eval_rows) == [3, 6]
    assert train_rows[6]["loss"] < train_rows[1]["loss"]
    for key in ("accuracy", "lr", "tokens_per_s", "grad_norm"):
        assert key in train_rows[1]
    assert "mfu" not in train_rows[1]  # CPU: no honest peak, so no MFU
    assert final["eval_loss"] == pytest.approx(eval_rows[6]["loss"])
    assert sorted(os.listdir(os.path.join(full, "checkpoints"))) == ["4", "6"]
    assert sorted(os.listdir(os.path.join(full, "data_state"))) == ["4", "6"]
    assert os.listdir(os.path.join(full, "tensorboard"))
    with open(os.path.join(full, "config.json")) as f:
        assert config_lib.from_dict(json.load(f)) == cfg

    # stop after 4 steps, then run the same config again: steps 5, 6 continue exactly
    part = str(tmp_path / "part")
    cfg4 = config_lib.copy_config(cfg)
    cfg4.train.steps = 4
    trainer.train(cfg4, part, train_iter=tf_iterator(cfg),
                  eval_iter_fn=lambda: tf_iterator(cfg, seed=1))
    trainer.train(cfg, part, train_iter=tf_iterator(cfg), allow_config_change=True,
                  eval_iter_fn=lambda: tf_iterator(cfg, seed=1))
    resumed = read_metrics(part)
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([resumed[s]["loss"] for s in range(1, 7)],
                               [train_rows[s]["loss"] for s in range(1, 7)], rtol=1e-6)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = tiny_config()
    cfg.train.steps, cfg.train.eval_steps = 4, 0
    cfg.checkpoint.every_steps = 2
    wd = str(tmp_path / "run")
    trainer.train(cfg, wd, train_iter=tf_iterator(cfg))
    _, good = checkpointing.load_params(wd)
    cfg.train.steps, cfg.optim.learning_rate = 10, 1e30  # params blow up, then the loss
    os.remove(os.path.join(wd, "config.json"))  # the config guard would refuse the new lr
    with pytest.raises(UserError, match=r"step [56] was not finite .*last checkpoint \(4\) "
                                        r"is good"):
        trainer.train(cfg, wd, train_iter=tf_iterator(cfg))
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2", "4"]
    _, after = checkpointing.load_params(wd)
    jax.tree.map(np.testing.assert_array_equal, after, good)
    rows = read_metrics(wd)
    assert all(np.isfinite(r["loss"]) for r in rows.values())


def test_non_finite_step_leaves_the_donated_state_unchanged():
    cfg = tiny_config()
    model = build_model(cfg.model)
    mesh = partitioning.make_mesh(config_lib.MeshConfig(), jax.devices()[:1])
    tx = optim.make_optimizer(cfg.optim, 10)
    state, sh = trainer.create_train_state(cfg, model, mesh, tx)
    step = trainer.make_train_step(cfg, model, tx, mesh, sh)
    batch = partitioning.global_batch(synthetic_batches(cfg, 1)[0],
                                      partitioning.batch_sharding(mesh))
    state, m = step(state, batch)  # a finite step is applied
    assert float(m["finite"]) == 1 and float(m["params_finite"]) == 1
    assert int(state.step) == 1
    bad = jax.tree.map(np.array, jax.device_get(state))  # writable host copies
    bad.params["decoder"]["decoder_norm"]["scale"][0] = np.nan  # loss and gradients go NaN
    before = jax.tree.map(np.copy, bad)
    state, m = step(jax.device_put(bad, sh), batch)  # donated: the old buffers are gone
    assert float(m["finite"]) == 0 and np.isnan(float(m["loss"]))
    after = jax.device_get(state)
    assert int(after.step) == 1
    jax.tree.map(np.testing.assert_array_equal, after, before)  # params and Adam moments


def test_update_that_overflows_the_params_stops_even_when_skipping_nan_steps(tmp_path):
    cfg = tiny_config()
    cfg.train.steps, cfg.train.eval_steps, cfg.train.stop_on_nan = 4, 0, False
    cfg.checkpoint.every_steps = 2
    wd = str(tmp_path / "run")
    trainer.train(cfg, wd, train_iter=tf_iterator(cfg))
    cfg.train.steps, cfg.optim.learning_rate = 10, 1e30  # finite gradients, huge update
    os.remove(os.path.join(wd, "config.json"))  # the config guard would refuse the new lr
    with pytest.raises(UserError, match=r"step 5 was not finite \(the update overflowed the "
                                        r"parameters.*last checkpoint \(4\) is good"):
        trainer.train(cfg, wd, train_iter=tf_iterator(cfg))
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2", "4"]


def test_matmul_flops_counts_every_matmul_including_scanned_layers():
    from t5lite.monitor import flops
    import jax.numpy as jnp

    def f(x, w):
        def layer(h, wi):
            return jnp.tanh(h @ wi), None
        h, _ = jax.lax.scan(layer, x, w)  # 3 layers of [4, 8] @ [8, 8]
        return jnp.einsum("bd,bd->b", h, h)  # + 4 * 8 multiply-adds
    x, w = jnp.ones((4, 8)), jnp.ones((3, 8, 8))
    assert flops.matmul_flops(f, x, w) == 3 * 2 * 4 * 8 * 8 + 2 * 4 * 8
    # the trainer's count for the tiny GPT: 3 x (2 x matmul params x tokens + attention)
    cfg = tiny_config()
    model = build_model(cfg.model)
    mesh = partitioning.make_mesh(config_lib.MeshConfig(), jax.devices()[:1])
    abstract, _, _ = trainer.abstract_train_state(cfg, model, mesh, optim.make_optimizer(
        cfg.optim, 1))
    B, L, D, F, V, H, K = 16, 16, 32, 64, 128, 4, 8
    dense = D * H * K * 4 + 2 * D * F + D * V  # q k v o, mlp in/out, tied logits
    expect = 3 * (2 * dense * B * L + 2 * 2 * B * H * L * L * K)
    assert trainer.step_flops(cfg, model, mesh, abstract.params, B) == expect


@pytest.mark.parametrize("preset", ["t5_1_1", "gpt2"])
def test_step_flops_are_the_models_whatever_attention_kernel_runs_it(preset, monkeypatch):
    """A fused kernel hides its matmuls from the jaxpr (a Pallas body holds one block's dots;
    cuDNN's attention is one custom call), so MFU would drop by the attention's share: every
    kernel is counted as the xla model's math."""
    from t5lite.config import presets
    from t5lite.models import gpu_attention
    monkeypatch.setattr(gpu_attention, "INTERPRET_OFF_GPU", True)
    mesh = partitioning.make_mesh(config_lib.MeshConfig(), jax.devices()[:1])
    counts = {}
    for kernel in ("xla", "flash", "flash_gpu"):
        cfg = config_lib.replace(getattr(presets, preset)("tiny"), {
            "model.attention_kernel": kernel, "model.dropout_rate": 0.0,
            "model.dtype": "bfloat16"})
        model = build_model(cfg.model)
        abstract, _, _ = trainer.abstract_train_state(cfg, model, mesh, optim.make_optimizer(
            cfg.optim, 1))
        counts[kernel] = trainer.step_flops(cfg, model, mesh, abstract.params, 2)
    assert counts["flash"] == counts["xla"] == counts["flash_gpu"], counts
