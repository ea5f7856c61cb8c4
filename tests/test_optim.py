"""Schedules (T5 rsqrt, warmup + constant / cosine / linear) and the three optimizers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite.train import optim


def ocfg(**kw):
    return config_lib.OptimizerConfig(**kw)


def test_rsqrt_is_t5s_schedule():
    s = optim.make_schedule(ocfg(schedule="rsqrt", learning_rate=0.01, warmup_steps=10000), 10**6)
    for step in (0, 1, 5000, 10000, 40000, 250000):
        np.testing.assert_allclose(s(step), 1.0 / np.sqrt(max(step, 10000)), rtol=1e-6)


def test_rsqrt_with_a_ramp_is_mesh_tfs_adam_schedule():
    """learning_rate_schedules/adam.gin of Narang et al.'s code: 0.05 * linear_warmup(4,000)
    * truncated_rsqrt(10,000) (Mesh TF: min(1, step / 4000) / sqrt(max(step, 10000)))."""
    s = optim.make_schedule(ocfg(schedule="rsqrt", learning_rate=5e-4, warmup_steps=10000,
                                 ramp_steps=4000), 10**6)
    for step in (0, 1, 2000, 4000, 7000, 10000, 40000, 250000):
        want = 0.05 * min(1.0, step / 4000) / np.sqrt(max(step, 10000))
        np.testing.assert_allclose(s(step), want, rtol=1e-6, atol=1e-12)
    with pytest.raises(UserError, match="optim.ramp_steps"):
        optim.make_schedule(ocfg(schedule="cosine", ramp_steps=10), 100)(0)


def test_warmup_then_constant_cosine_linear():
    kw = dict(learning_rate=1.0, warmup_steps=10, min_lr_ratio=0.1)
    const = optim.make_schedule(ocfg(schedule="constant", **kw), 110)
    cos = optim.make_schedule(ocfg(schedule="cosine", **kw), 110)
    lin = optim.make_schedule(ocfg(schedule="linear", **kw), 110)
    for s in (const, cos, lin):
        np.testing.assert_allclose([s(0), s(4), s(9)], [0.1, 0.5, 1.0], rtol=1e-6)
        np.testing.assert_allclose(s(10), 1.0, rtol=1e-6)
    np.testing.assert_allclose(const(100), 1.0)
    np.testing.assert_allclose([cos(60), cos(110), cos(500)], [0.55, 0.1, 0.1], rtol=1e-5)
    np.testing.assert_allclose([lin(60), lin(110)], [0.55, 0.1], rtol=1e-5)


def _params():
    k = jax.random.split(jax.random.key(0), 3)
    return {"dense": {"kernel": jax.random.normal(k[0], (256, 192)) * 0.05},
            "norm": {"scale": jnp.ones((256,))}, "head": {"kernel": jax.random.normal(k[1], (8, 4))}}


def test_adafactor_factors_large_matrices_and_clips_updates():
    params = _params()
    tx = optim.make_optimizer(ocfg(name="adafactor", schedule="constant", warmup_steps=0,
                                   learning_rate=1e-2), 100)
    state = tx.init(params)
    shapes = {jax.tree_util.keystr(p): x.shape for p, x in
              jax.tree_util.tree_leaves_with_path(state)}
    # optax names: v_row keeps the columns' size, v_col the rows' (the other dim is reduced)
    assert shapes["[0].v_row['dense']['kernel']"] == (192,)
    assert shapes["[0].v_col['dense']['kernel']"] == (256,)
    assert shapes["[0].v['dense']['kernel']"] == (1,)  # no full second moment
    assert shapes["[0].v['head']['kernel']"] == (8, 4)  # small: not factored
    assert not any(k.endswith("mu") for k in shapes)  # no momentum
    grads = jax.tree.map(lambda p: jnp.full_like(p, 1e3), params)
    updates, _ = tx.update(grads, state, params)
    # update RMS clipped at 1, times lr, times the parameter's RMS (min 1e-3)
    u = updates["dense"]["kernel"]
    p_rms = jnp.sqrt(jnp.mean(params["dense"]["kernel"] ** 2))
    np.testing.assert_allclose(jnp.sqrt(jnp.mean(u ** 2)), 1e-2 * p_rms, rtol=1e-3)


def test_adamw_rms_scaled_is_adam_times_param_rms():
    params = _params()
    grads = jax.tree.map(lambda p: jnp.cos(p * 7.0) + 0.1, params)
    base = dict(schedule="constant", warmup_steps=0, learning_rate=0.02)
    adam = optim.make_optimizer(ocfg(name="adamw", **base), 10)
    scaled = optim.make_optimizer(ocfg(name="adamw_rms_scaled", **base), 10)
    ua, _ = adam.update(grads, adam.init(params), params)
    us, _ = scaled.update(grads, scaled.init(params), params)
    for k in ("dense", "norm"):
        leaf = list(params[k].values())[0]
        rms = max(float(jnp.sqrt(jnp.mean(leaf ** 2))), 1e-3)
        np.testing.assert_allclose(list(us[k].values())[0], list(ua[k].values())[0] * rms,
                                   rtol=1e-5, atol=1e-9)


def test_weight_decay_only_on_matrices_and_frozen_params_do_not_move():
    params = _params()
    zero = jax.tree.map(jnp.zeros_like, params)
    tx = optim.make_optimizer(ocfg(name="adamw", schedule="constant", warmup_steps=0,
                                   learning_rate=0.1, weight_decay=0.5), 10)
    u, _ = tx.update(zero, tx.init(params), params)
    np.testing.assert_allclose(u["dense"]["kernel"], -0.1 * 0.5 * params["dense"]["kernel"],
                               rtol=1e-6)
    np.testing.assert_allclose(u["norm"]["scale"], 0.0)
    mask = {"dense": {"kernel": False}, "norm": {"scale": True}, "head": {"kernel": True}}
    tx = optim.make_optimizer(ocfg(name="adamw", schedule="constant", warmup_steps=0), 10,
                              trainable_mask=mask)
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    u, _ = tx.update(grads, state, params)
    assert float(jnp.abs(u["dense"]["kernel"]).max()) == 0.0
    assert float(jnp.abs(u["head"]["kernel"]).min()) > 0.0
    # no Adam moments allocated for the frozen matrix
    n_state = sum(x.size for x in jax.tree.leaves(state))
    assert n_state < 2 * (256 + 32) + 10


def test_unknown_optimizer_is_a_user_error():
    with pytest.raises(UserError, match="adafactor, adamw or adamw_rms_scaled"):
        optim.make_optimizer(ocfg(name="sgd"), 10)


def test_adafactor_factors_attention_kernels_as_mesh_tensorflow():
    """The T5 paper's Mesh TensorFlow stores a query kernel [d_model, heads * d_kv] and
    factors its second moments; as [d_model, heads, d_kv] optax would keep them whole (the
    second-largest dim, d_kv = 64, is under min_dim_size_to_factor = 128)."""
    from flax import linen as nn

    from t5lite.models import abstract_params
    cfg = config_lib.load_config("t5_1_1_small")
    tx = optim.make_optimizer(cfg.optim, 10)
    for flat, factored in ((True, True), (False, False)):
        cfg = config_lib.replace(cfg, {"model.flat_kernels": flat})
        params = nn.meta.unbox(abstract_params(cfg.model))
        state = jax.eval_shape(tx.init, params)
        v = state[0].v["encoder"]["layers"]["attention"]["query"]["kernel"]
        assert (v.shape == (1,)) == factored, (flat, v.shape)
