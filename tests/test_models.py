"""Model tests on tiny configs: masks, packing, KV cache, scan/remat equivalence, variants, sizes.

Every forward pass is jitted (one compile per config and shape) to keep the file fast.
"""

import dataclasses
import functools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from train_helpers import random_model_batch

from t5lite.config import ModelConfig, load_config
from t5lite.errors import UserError
from t5lite.models import (PUBLISHED, abstract_params, build_model, count_params, dummy_batch,
                           init_cache)
from numerics import assert_trees_close_at_scale


ATOL = 1e-5
# rbg keys: the same flax code, but far faster XLA:CPU compiles than threefry (dropout masks).
KEY = functools.partial(jax.random.key, impl="rbg")
B, N_IN, N_TGT = 3, 10, 8  # one batch shape everywhere, so compiled functions are reused


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.1, max_length=32)
    base.update(kw)
    return ModelConfig(**base)


# The shared models (dropout on; tests that compare outputs run deterministic=True).
MODELS = {
    "t5": dict(architecture="encoder_decoder"),
    "lm_rope": dict(architecture="decoder_only", position="rope", num_classes=3),
    "lm_learned": dict(architecture="decoder_only", position="learned", norm="layernorm",
                       use_bias=True, scale_attn_logits=True, scale_tied_logits=False),
    "prefix_lm": dict(architecture="prefix_lm", num_classes=3),
    "bert": dict(architecture="encoder_only", position="learned", norm="layernorm",
                 pre_norm=False, embed_norm=True, use_bias=True, num_token_types=2,
                 nsp_head=True, num_classes=3, scale_attn_logits=True),
}


def init(cfg, batch, seed=0):
    model = build_model(cfg)
    rngs = {"params": KEY(seed), "dropout": KEY(1)}
    variables = jax.jit(functools.partial(model.init, deterministic=True))(rngs, batch)
    return model, nn.meta.unbox(variables["params"])


def forward(model):
    """Jitted deterministic forward: (params, batch) -> outputs dict."""
    return jax.jit(lambda p, b: model.apply({"params": p}, b, deterministic=True))


@functools.lru_cache(maxsize=None)
def shared(name):
    """(cfg, model, params, jitted forward) for one of MODELS, built once per test session."""
    cfg = tiny(**MODELS[name])
    model, params = init(cfg, random_batch(cfg))
    return cfg, model, params, forward(model)


def random_batch(cfg, b=B, n_in=N_IN, n_tgt=N_TGT, seed=0):
    if cfg.architecture == "prefix_lm":  # decoder length = inputs + targets
        n_in, n_tgt = 0, n_tgt
    return random_model_batch(cfg, b, n_in, n_tgt, seed)


def changed(batch, key, positions):
    """A copy of batch with the tokens of ``key`` at ``positions`` replaced."""
    out = dict(batch, **{key: batch[key].copy()})
    out[key][:, positions] = out[key][:, positions] % 50 + 7
    return out


# ----------------------------------------------------------------------------- basics


@pytest.mark.parametrize("name", ["t5", "bert"])
def test_training_mode_uses_dropout_rng(name):
    cfg, model, params, fwd = shared(name)
    batch = random_batch(cfg)
    train = jax.jit(lambda p, b, key: model.apply({"params": p}, b, deterministic=False,
                                                  rngs={"dropout": key}))
    out = train(params, batch, KEY(3))
    n = batch.get("decoder_input_tokens", batch.get("encoder_input_tokens")).shape[1]
    assert out["logits"].shape == (B, n, cfg.vocab_size)
    assert out["logits"].dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(out["logits"])))
    assert ("class_logits" in out) == (cfg.num_classes > 0)
    if cfg.num_classes:
        assert out["class_logits"].shape == (B, 3)
    if cfg.nsp_head:
        assert out["nsp_logits"].shape == (B, 2)
    # dropout draws from the "dropout" rng; deterministic=True does not use it
    assert not np.allclose(out["logits"], train(params, batch, KEY(4))["logits"])
    eval_logits = fwd(params, batch)["logits"]
    assert not np.allclose(out["logits"], eval_logits)
    np.testing.assert_array_equal(eval_logits, fwd(params, batch)["logits"])


@pytest.mark.parametrize("name", ["lm_rope", "lm_learned", "prefix_lm"])
def test_decoder_only_outputs(name):
    cfg, _, params, fwd = shared(name)
    out = fwd(params, random_batch(cfg))
    assert out["logits"].shape == (B, N_TGT, cfg.vocab_size) and out["logits"].dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(out["logits"])))
    assert ("class_logits" in out) == (cfg.num_classes > 0)
    if cfg.num_classes:
        assert out["class_logits"].shape == (B, 3)


def test_gpt_classifier_reads_last_real_token():
    cfg, _, params, fwd = shared("lm_rope")
    batch = random_batch(cfg)
    batch["decoder_segment_ids"][:, 6:] = 0  # 6 real tokens, then padding
    base = fwd(params, batch)["class_logits"]
    np.testing.assert_allclose(base, fwd(params, changed(batch, "decoder_input_tokens", 7))[
        "class_logits"], atol=ATOL)
    assert not np.allclose(base, fwd(params, changed(batch, "decoder_input_tokens", 5))[
        "class_logits"], atol=1e-4)


def test_params_are_float32_and_logically_partitioned():
    allowed = {"vocab", "embed", "mlp", "heads", "kv", "layers", "relpos_buckets",
               "token_types", "abspos", "classes"}
    for arch in ("encoder_decoder", "decoder_only", "encoder_only"):
        cfg = tiny(architecture=arch, dtype="bfloat16", position="learned", num_token_types=2,
                   pooler=True, tie_embeddings=False)
        boxed = abstract_params(cfg)
        leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
        for leaf in leaves:
            assert isinstance(leaf, nn.LogicallyPartitioned), leaf
            assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= allowed, leaf.names
            assert leaf.value.dtype == jnp.float32


def test_user_errors():
    with pytest.raises(UserError, match="shared_encoder_decoder"):
        build_model(tiny(architecture="decoder_only", shared_encoder_decoder=True))
    with pytest.raises(UserError, match="num_classes"):
        build_model(tiny(architecture="encoder_decoder", num_classes=2))
    with pytest.raises(UserError, match="targets"):
        dummy_batch(tiny(architecture="decoder_only"), 2, {"inputs": 8})
    with pytest.raises(UserError, match="encoder_input_tokens"):
        _, model, params, _ = shared("t5")
        init_cache(model, params, 2, 4)


# ----------------------------------------------------------------------------- masks


@pytest.mark.parametrize("name", ["lm_rope", "lm_learned", "t5"])
def test_causal_leak(name):
    """Changing decoder tokens from position 5 on leaves the logits before 5 unchanged."""
    cfg, _, params, fwd = shared(name)
    batch = random_batch(cfg)
    base = fwd(params, batch)["logits"]
    new = fwd(params, changed(batch, "decoder_input_tokens", slice(5, None)))["logits"]
    np.testing.assert_allclose(base[:, :5], new[:, :5], atol=ATOL)
    assert not np.allclose(base[:, 5:], new[:, 5:], atol=1e-3)
    if cfg.architecture == "encoder_decoder":  # every decoder position sees the whole input
        new = fwd(params, changed(batch, "encoder_input_tokens", -1))["logits"]
        assert not np.allclose(base[:, 0], new[:, 0], atol=1e-4)


def test_prefix_lm_mask():
    cfg, _, params, fwd = shared("prefix_lm")
    batch = random_batch(cfg)  # decoder length 8, prefix = first 4
    batch["decoder_causal_attention"][:] = (np.arange(N_TGT) < 4)[None]
    base = fwd(params, batch)["logits"]
    in_prefix = fwd(params, changed(batch, "decoder_input_tokens", 3))["logits"]
    assert not np.allclose(base[:, 0], in_prefix[:, 0], atol=1e-4)  # position 0 sees token 3
    after = fwd(params, changed(batch, "decoder_input_tokens", 5))["logits"]
    np.testing.assert_allclose(base[:, :5], after[:, :5], atol=ATOL)  # nobody before 5 sees 5
    assert not np.allclose(base[:, 5:], after[:, 5:], atol=1e-4)
    # without decoder_causal_attention it is a plain causal LM
    plain = dict(batch, decoder_causal_attention=np.zeros_like(batch["decoder_causal_attention"]))
    np.testing.assert_allclose(
        fwd(params, plain)["logits"][:, :3],
        fwd(params, changed(plain, "decoder_input_tokens", 3))["logits"][:, :3], atol=ATOL)


def _pack(seqs, length):
    """Pack token lists into one row: tokens, segment ids (1, 2, ...), per-segment positions."""
    tok, seg, pos = (np.zeros(length, np.int32) for _ in range(3))
    i = 0
    for s_id, s in enumerate(seqs, 1):
        tok[i:i + len(s)], seg[i:i + len(s)], pos[i:i + len(s)] = s, s_id, np.arange(len(s))
        i += len(s)
    return tok, seg, pos


@pytest.mark.parametrize("name", ["t5", "lm_learned", "lm_rope"])
def test_packing_isolation(name):
    """Two packed sequences give the same outputs as each alone (self- and cross-attention)."""
    cfg, _, params, fwd = shared(name)
    rng = np.random.default_rng(0)
    enc = [rng.integers(1, 64, 6), rng.integers(1, 64, 3)]
    dec = [rng.integers(1, 64, 3), rng.integers(1, 64, 5)]
    rows = [(enc, dec), ([enc[0]], [dec[0]]), ([enc[1]], [dec[1]])]
    batch = {}
    for prefix, n, i in (("encoder", N_IN, 0), ("decoder", N_TGT, 1)):
        packed = [_pack(row[i], n) for row in rows]
        batch[f"{prefix}_input_tokens"] = np.stack([p[0] for p in packed])
        batch[f"{prefix}_segment_ids"] = np.stack([p[1] for p in packed])
        batch[f"{prefix}_positions"] = np.stack([p[2] for p in packed])
    if cfg.architecture != "encoder_decoder":
        batch = {k: v for k, v in batch.items() if k.startswith("decoder")}
    batch["decoder_target_tokens"] = batch["decoder_input_tokens"]
    logits = fwd(params, batch)["logits"]
    n0, n1 = len(dec[0]), len(dec[1])
    np.testing.assert_allclose(logits[0, :n0], logits[1, :n0], atol=ATOL)
    np.testing.assert_allclose(logits[0, n0:n0 + n1], logits[2, :n1], atol=ATOL)


# ----------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("name", ["t5", "lm_rope", "lm_learned", "prefix_lm"])
def test_cached_decoding_equals_full_forward(name):
    """Prefill a 3-token chunk, then decode one token at a time: same logits as one full pass
    (prefix LM: the 3-token prompt chunk is bidirectional, as in the full pass)."""
    cfg, model, params, fwd = shared(name)
    batch = random_batch(cfg)
    if cfg.architecture == "prefix_lm":
        batch["decoder_causal_attention"][:] = (np.arange(N_TGT) < 3)[None]
    full = fwd(params, batch)["logits"]
    kwargs = {}
    if cfg.architecture == "encoder_decoder":
        encoded = jax.jit(lambda p, t: model.apply({"params": p}, t, method="encode"))(
            params, batch["encoder_input_tokens"])
        kwargs = dict(encoded=encoded, encoder_input_tokens=batch["encoder_input_tokens"])
    cache = init_cache(model, params, B, N_TGT, batch.get("encoder_input_tokens"))

    @jax.jit
    def step(cache, tokens, extra):
        return model.apply({"params": params, "cache": cache}, tokens, decode=True,
                           mutable=["cache"], method="decode", **kwargs, **extra)

    outs = []
    for lo, hi in [(0, 3)] + [(i, i + 1) for i in range(3, N_TGT)]:
        extra = {}
        if cfg.architecture == "prefix_lm":
            extra["decoder_causal_attention"] = batch["decoder_causal_attention"][:, lo:hi]
        logits, mutated = step(cache, batch["decoder_input_tokens"][:, lo:hi], extra)
        cache = mutated["cache"]
        outs.append(logits)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- scan / remat


def _restack(params):
    """Unrolled params (layers_0, layers_1, ...) -> scanned params (layers, leading axis)."""
    if not isinstance(params, dict):
        return params
    out = {k: _restack(v) for k, v in params.items() if not k.startswith("layers_")}
    layer_keys = sorted((k for k in params if k.startswith("layers_")),
                        key=lambda k: int(k.split("_")[1]))
    if layer_keys:
        out["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[k] for k in layer_keys])
    return out


def _unstack(params, n):
    """Scanned params (layers, leading axis) -> unrolled params (layers_0, layers_1, ...)."""
    if not isinstance(params, dict):
        return params
    out = {k: _unstack(v, n) for k, v in params.items() if k != "layers"}
    for i in range(n if "layers" in params else 0):
        out[f"layers_{i}"] = jax.tree.map(lambda x: x[i], params["layers"])
    return out


def test_scan_equals_unrolled():
    scan_cfg, _, stacked, scan_fwd = shared("t5")
    cfg = tiny(**{**MODELS["t5"], "scan_layers": False})
    params = _unstack(stacked, 2)
    # the unstacked tree has exactly the shapes an unrolled model initialises; round trip
    want = jax.tree.map(lambda x: x.shape, nn.meta.unbox(abstract_params(cfg)))
    assert jax.tree.map(lambda x: x.shape, params) == want
    jax.tree.map(np.testing.assert_array_equal, _restack(params), stacked)
    batch = random_batch(cfg)
    np.testing.assert_allclose(forward(build_model(cfg))(params, batch)["logits"],
                               scan_fwd(stacked, batch)["logits"], atol=ATOL)


def test_flat_kernels_are_the_same_layer():
    """model.flat_kernels stores attention kernels [fan_in, fan_out]; the old [D, H, K] /
    [H, K, D] params reshaped into them give the same outputs (checkpoint merge does it)."""
    from t5lite.store import checkpointing
    flat_cfg, _, flat_params, flat_fwd = shared("t5")
    old_cfg = tiny(**{**MODELS["t5"], "flat_kernels": False})
    batch = random_batch(old_cfg)
    _, old = init(old_cfg, batch, seed=3)
    q_old = old["encoder"]["layers"]["attention"]["query"]["kernel"]
    q_new = flat_params["encoder"]["layers"]["attention"]["query"]["kernel"]
    assert q_old.shape == (2, 32, 4, 8) and q_new.shape == (2, 32, 32)
    o_new = flat_params["decoder"]["layers"]["encoder_decoder_attention"]["out"]["kernel"]
    assert o_new.shape == (2, 32, 32)
    moved = checkpointing.merge_params(flat_params, old, announce=lambda *_: None)
    assert jax.tree.map(jnp.shape, moved) == jax.tree.map(jnp.shape, flat_params)
    np.testing.assert_allclose(flat_fwd(moved, batch)["logits"],
                               forward(build_model(old_cfg))(old, batch)["logits"], atol=ATOL)


@pytest.mark.parametrize("layers,unroll", [(2, 0), (3, 2)])
def test_scan_unroll_equals_loop(layers, unroll):
    """model.scan_unroll keeps the stacked parameter tree, logits and gradients: every layer in
    one iteration (0), and two a iteration over three layers (a remainder of one). Distinct
    programs: on the two-layer model an unroll of 2 would compile the same one as 0."""
    cfg = tiny(**MODELS["t5"], num_encoder_layers=layers, num_decoder_layers=layers)
    batch = random_batch(cfg)
    _, params = init(cfg, batch)
    results = []
    for u in (1, unroll):
        model = build_model(dataclasses.replace(cfg, scan_unroll=u))

        def loss(p):
            logits = model.apply({"params": p}, batch, deterministic=True)["logits"]
            return jnp.mean(jax.nn.log_softmax(logits)[..., 3]), logits

        results.append(jax.jit(jax.value_and_grad(loss, has_aux=True))(params))
    ((v1, l1), g1), ((v2, l2), g2) = results
    np.testing.assert_allclose(l2, l1, atol=ATOL)
    np.testing.assert_allclose(v2, v1, rtol=1e-6)
    assert_trees_close_at_scale(g2, g1)


def test_remat_policies_equal_outputs_and_grads():
    results = {}
    _, _, params, _ = shared("lm_rope")
    for remat in ("none", "minimal", "full"):
        cfg = tiny(**{**MODELS["lm_rope"], "remat": remat})
        batch = random_batch(cfg)
        model = build_model(cfg)

        def loss(p):
            logits = model.apply({"params": p}, batch, deterministic=True)["logits"]
            return jnp.mean(jax.nn.log_softmax(logits)[..., 3]), logits

        (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        results[remat] = (value, logits, grads)
    ref = results["none"]
    for remat, (value, logits, grads) in results.items():
        np.testing.assert_allclose(value, ref[0], rtol=1e-6, err_msg=remat)
        np.testing.assert_allclose(logits, ref[1], atol=ATOL, err_msg=remat)
        assert_trees_close_at_scale(grads, ref[2], err_msg=remat)


# ----------------------------------------------------------------------------- variants

FFNS = ("relu", "gelu", "gelu_tanh", "silu", "glu", "geglu", "reglu", "swiglu", "bilinear")
POSITIONS = ("relative", "learned", "sinusoidal", "rope", "alibi")
ARCHS = ("decoder_only", "encoder_decoder", "encoder_only", "prefix_lm")


@pytest.mark.parametrize("ffn", FFNS)
def test_ffn_variants(ffn):
    from t5lite.models.layers import GATED, MLP
    cfg = tiny(ffn=ffn, use_bias=True)
    mlp = MLP(cfg)
    x = np.random.default_rng(0).normal(size=(2, 5, cfg.d_model)).astype(np.float32)
    params = jax.jit(mlp.init)(KEY(0), x)["params"]
    assert set(params) == ({"wi_0", "wi_1", "wo"} if ffn in GATED else {"wi", "wo"})
    y = jax.jit(mlp.apply)({"params": params}, x)
    assert y.shape == x.shape and bool(jnp.all(jnp.isfinite(y)))
    assert float(jnp.std(y)) > 1e-3


@pytest.mark.parametrize("i", range(len(POSITIONS)))
def test_variants_run_and_are_finite(i):
    """Every position scheme, norm, pre/post-norm, tying option and compute dtype, cycled over
    the architectures so each is used in several kinds of stack (5 small one-layer models)."""
    cfg = tiny(architecture=ARCHS[i % 4], position=POSITIONS[i], ffn=FFNS[2 * i],
               norm=("rmsnorm", "layernorm")[i % 2], pre_norm=i % 3 != 2,
               tie_embeddings=i % 2 == 0, use_bias=i % 2 == 1, num_encoder_layers=1,
               num_decoder_layers=1, dtype=("float32", "bfloat16")[i % 3 == 1])
    model = build_model(cfg)
    batch = random_batch(cfg)
    keys = {"params": KEY(0), "dropout": KEY(1)}

    @jax.jit
    def run(batch):
        params = model.init(keys, batch, deterministic=True)["params"]
        return params, model.apply({"params": params}, batch, deterministic=False, rngs=keys)

    params, out = run(batch)
    assert out["logits"].dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(out["logits"])))
    flat = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(params))[0]
    assert all(x.dtype == jnp.float32 for _, x in flat)  # params stay float32
    names = {jax.tree_util.keystr(p) for p, _ in flat}
    assert any("'logits_dense'" in n for n in names) == (
        not cfg.tie_embeddings and cfg.architecture != "encoder_only")
    assert any("'relpos_bias'" in n for n in names) == (cfg.position == "relative")
    assert any("'position_embedder'" in n for n in names) == (cfg.position == "learned")
    assert any("post_mlp_layer_norm" in n for n in names) == (not cfg.pre_norm)


def test_shared_encoder_decoder_has_fewer_params_and_runs():
    cfg = tiny(architecture="encoder_decoder")
    shared_cfg = tiny(architecture="encoder_decoder", shared_encoder_decoder=True)
    n, n_shared = count_params(cfg), count_params(shared_cfg)
    assert n_shared < n
    encoder = sum(np.prod(x.shape) for x in jax.tree.leaves(
        nn.meta.unbox(abstract_params(cfg))["encoder"]))
    assert n - n_shared == encoder  # layers, relative bias and final norm: all shared
    model = build_model(shared_cfg)

    @jax.jit
    def run(batch):
        params = model.init({"params": KEY(0)}, batch, deterministic=True)["params"]
        return params, model.apply({"params": params}, batch, deterministic=True)["logits"]

    params, logits = run(random_batch(shared_cfg))
    assert "encoder" not in params and "layers" in params["decoder"]
    assert bool(jnp.all(jnp.isfinite(logits)))


# ----------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published(name):
    cfg = load_config(name).model
    got = count_params(cfg, heads=False)
    assert abs(got - PUBLISHED[name]) / PUBLISHED[name] < 0.005, (name, got)


def test_every_model_config_loads_and_builds():
    from t5lite.config import available_configs, validate
    names = [n for n in available_configs() if n.split("_")[0] in ("t5", "bert", "gpt2")]
    assert len(names) >= 19
    for name in names:
        cfg = load_config(name)
        validate(cfg)
        build_model(cfg)  # model-level checks
        assert cfg.name == name


def test_cli_models_table():
    out = subprocess.run([sys.executable, "-m", "t5lite.cli", "models", "t5_1_0_small",
                          "bert_base"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "t5_1_0_small" in out.stdout and "60.5M" in out.stdout
    assert "bert_base" in out.stdout and "109.5M" in out.stdout
