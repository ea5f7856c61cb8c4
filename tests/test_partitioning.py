"""Meshes, logical rules, sharded training equal to one device, fsdp memory, mesh errors."""

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite.models import build_model
from t5lite.mesh import partitioning
from t5lite.train import optim, trainer
from train_helpers import synthetic_batches, tiny_config


def mesh_cfg(data, fsdp, tensor):
    return config_lib.MeshConfig(data=data, fsdp=fsdp, tensor=tensor)


def test_mesh_shape_resolves_minus_one_and_rejects_bad_meshes():
    assert partitioning.mesh_shape(mesh_cfg(-1, 2, 2), 8) == (2, 2, 2)
    assert partitioning.mesh_shape(mesh_cfg(1, -1, 1), 8) == (1, 8, 1)
    mesh = partitioning.make_mesh(mesh_cfg(2, -1, 2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    with pytest.raises(UserError, match="does not divide the 8 devices"):
        partitioning.mesh_shape(mesh_cfg(-1, 3, 1), 8)
    with pytest.raises(UserError, match=r"divides 1 \(e.g. --set mesh.tensor=1\)"):
        partitioning.mesh_shape(mesh_cfg(1, -1, 4), 1)
    with pytest.raises(UserError, match="uses 4 devices but 8 are available"):
        partitioning.mesh_shape(mesh_cfg(2, 2, 1), 8)
    with pytest.raises(UserError, match="at most one"):
        partitioning.mesh_shape(mesh_cfg(-1, -1, 1), 8)


def test_logical_rules_map_params_and_activations():
    rules = partitioning.LOGICAL_RULES
    assert nn.logical_to_mesh_axes(("embed", "mlp"), rules) == P("fsdp", "tensor")
    assert nn.logical_to_mesh_axes(("vocab", "embed"), rules) == P("tensor", "fsdp")
    assert nn.logical_to_mesh_axes(("embed", "heads", "kv"), rules) == P("fsdp", "tensor", None)
    # activations: batch takes (data, fsdp), so embed stays unsharded
    assert nn.logical_to_mesh_axes(("batch", "length", "embed"), rules) == P(
        ("data", "fsdp"), None, None)
    assert nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"), rules) == P(
        ("data", "fsdp"), None, "tensor", None)


def test_batch_and_dims_that_do_not_divide_the_mesh_are_user_errors():
    mesh = partitioning.make_mesh(mesh_cfg(2, 4, 1))
    partitioning.check_batch(mesh, 16)
    with pytest.raises(UserError, match="multiple of 8"):
        partitioning.check_batch(mesh, 12)
    with pytest.raises(UserError, match="multiple of 32"):
        partitioning.check_batch(mesh, 16, grad_accum_steps=4)
    cfg = tiny_config()
    cfg.model.num_heads = 3
    cfg.mesh = mesh_cfg(1, 2, 4)
    mesh = partitioning.make_mesh(cfg.mesh)
    tx = optim.make_optimizer(cfg.optim, 10)
    with pytest.raises(UserError, match=r"'heads' of size 3 .* model.num_heads a multiple of 4"):
        trainer.abstract_train_state(cfg, build_model(cfg.model), mesh, tx)
    cfg.model.num_heads, cfg.model.d_ff = 4, 6
    with pytest.raises(UserError, match="model.d_ff a multiple of 4"):
        trainer.abstract_train_state(cfg, build_model(cfg.model), mesh, tx)


def test_every_attention_s_heads_must_divide_the_tensor_axis():
    """A flat kernel joins heads x head_dim; ELECTRA tiny's generator has 1 head of 32 (its
    kernels' joined dim, 32, divides by 4): tensor=4 cannot split that head, as with the
    [D, H, K] layout."""
    cfg = config_lib.load_config("electra_tiny")
    assert cfg.model.flat_kernels and cfg.model.num_heads % 4 == 0
    cfg = config_lib.replace(cfg, {"mesh": mesh_cfg(1, 2, 4)})
    mesh = partitioning.make_mesh(cfg.mesh)
    tx = optim.make_optimizer(cfg.optim, 10)
    with pytest.raises(UserError, match=r"'heads' .* model.num_heads a multiple of 4"):
        trainer.abstract_train_state(cfg, build_model(cfg.model), mesh, tx)


def test_adafactor_state_follows_params_or_is_replicated():
    cfg = tiny_config(optim="adafactor")
    cfg.model.d_model, cfg.model.d_ff, cfg.model.vocab_size = 128, 256, 256
    mesh = partitioning.make_mesh(mesh_cfg(1, 2, 4))
    tx = optim.make_optimizer(cfg.optim, 10)
    abstract, sh, _ = trainer.abstract_train_state(cfg, build_model(cfg.model), mesh, tx)
    specs = {jax.tree_util.keystr(p): (s.spec, a.shape) for (p, s), a in zip(
        jax.tree_util.tree_leaves_with_path(sh.opt_state), jax.tree.leaves(abstract.opt_state))}
    assert specs, "optimizer state has no leaves"
    # factored row / column statistics of a [embed, mlp] kernel are replicated
    v_row = [v for k, v in specs.items() if "v_row" in k and "wi" in k]
    assert v_row and all(spec == P() for spec, _ in v_row)
    # full second moments of 1-D params mirror the param (norm scales: embed -> fsdp)
    v_full = [v for k, v in specs.items() if ".v[" in k and "scale" in k]
    assert v_full and all(tuple(spec)[-1] == "fsdp" and len(spec) == len(shape)
                          for spec, shape in v_full)


def test_state_init_programs_take_the_compiler_options(monkeypatch):
    """The train state's and fresh params' init programs compile with compiler_options, as
    the step does (an option XLA does not know is refused: the options reached XLA)."""
    from t5lite.train import state
    cfg = tiny_config()
    model, mesh = build_model(cfg.model), partitioning.make_mesh(mesh_cfg(1, -1, 1))
    tx = optim.make_optimizer(cfg.optim, 10)
    _, shardings, _ = trainer.abstract_train_state(cfg, model, mesh, tx)
    monkeypatch.setattr(partitioning, "compiler_options",
                        lambda c, m: {"xla_t5lite_no_such_option": True})
    with pytest.raises(Exception, match="xla_t5lite_no_such_option"):
        state.create_train_state(cfg, model, mesh, tx, shardings=shardings)
    with pytest.raises(Exception, match="xla_t5lite_no_such_option"):
        state.init_params(cfg, model, mesh, shardings.params)


def _train(cfg, model, tx, mesh, state0, batches):
    abstract, sh, _ = trainer.abstract_train_state(cfg, model, mesh, tx)
    state = jax.device_put(state0, sh)
    step = trainer.make_train_step(cfg, model, tx, mesh, sh)
    bsh = partitioning.batch_sharding(mesh)
    losses = []
    for b in batches:
        state, m = step(state, partitioning.global_batch(b, bsh))
        losses.append(float(m["loss"]))
    return losses, state


def test_sharded_training_matches_one_device_and_fsdp_shards_memory():
    """5 steps (with dropout: keys are sharding-independent) on several meshes give the
    1-device losses; under fsdp=8 each device holds ~1/8 of the params and Adam state."""
    cfg = tiny_config(dropout=0.1)
    model = build_model(cfg.model)
    tx = optim.make_optimizer(cfg.optim, 10)
    batches = synthetic_batches(cfg, 5)
    one = partitioning.make_mesh(mesh_cfg(1, 1, 1), jax.devices()[:1])
    state0, _ = trainer.create_train_state(cfg, model, one, tx)
    state0 = jax.device_get(state0)
    ref, ref_state = _train(cfg, model, tx, one, state0, batches)
    assert ref[-1] < ref[0]
    for shape in [(8, 1, 1), (1, 8, 1), (2, 2, 2)]:  # (2, 2, 2): data and fsdp and tensor
        losses, state = _train(cfg, model, tx, partitioning.make_mesh(mesh_cfg(*shape)),
                               state0, batches)
        np.testing.assert_allclose(losses, ref, rtol=1e-4, err_msg=f"mesh {shape}")
        if shape == (1, 8, 1):
            for part in ("params", "opt_state"):
                full = partitioning.bytes_per_device(getattr(ref_state, part))
                mine = partitioning.bytes_per_device(getattr(state, part))
                assert full / 8 <= mine < full / 8 * 1.2, (part, full, mine)
