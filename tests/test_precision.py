"""bf16 compute with float32 parameters (the accelerator presets' default, as t5x trains T5
v1.1): a bf16 run's losses track a float32 run's on CPU; tiny presets stay float32."""

import jax
import numpy as np
import pytest

from t5lite import config as config_lib
from t5lite.models import build_model
from t5lite.mesh import partitioning
from t5lite.train import optim, trainer
from train_helpers import synthetic_batches, tiny_config


def _losses(cfg, batches):
    model = build_model(cfg.model)
    mesh = partitioning.make_mesh(config_lib.MeshConfig(data=1), jax.devices()[:1])
    tx = optim.make_optimizer(cfg.optim, len(batches))
    state, sh = trainer.create_train_state(cfg, model, mesh, tx)
    step = trainer.make_train_step(cfg, model, tx, mesh, sh)
    bsh = partitioning.batch_sharding(mesh)
    out = []
    for b in batches:
        state, m = step(state, partitioning.global_batch(b, bsh))
        out.append(float(m["loss"]))
    dtypes = {x.dtype for x in jax.tree.leaves(state.params)}
    return np.array(out), dtypes


@pytest.mark.parametrize("arch", ["encoder_decoder"])
def test_bf16_losses_track_float32(arch):
    cfg = tiny_config(arch, batch_size=8, length=16, lr=1e-2)
    batches = synthetic_batches(cfg, 12)
    f32, _ = _losses(cfg, batches)
    cfg.model.dtype = "bfloat16"
    bf16, dtypes = _losses(cfg, batches)
    assert dtypes == {np.dtype("float32")}  # parameters (and updates) stay float32
    assert f32[-1] < f32[0] - 0.5 and bf16[-1] < bf16[0] - 0.5  # both learn
    np.testing.assert_allclose(bf16, f32, rtol=0.03, atol=0.03)
    assert not np.array_equal(bf16, f32)  # it did compute in bf16


@pytest.mark.parametrize("name, dtype", [
    ("t5_1_1_tiny", "float32"), ("gpt2_tiny", "float32"), ("bert_tiny", "float32"),
    ("t5_1_1_base", "bfloat16"), ("t5_1_0_small", "bfloat16"), ("bert_base", "bfloat16"),
    ("gpt2_small", "bfloat16"), ("t5_1_1_xl", "bfloat16")])
def test_presets_compute_dtype(name, dtype):
    assert config_lib.load_config(name).model.dtype == dtype
