"""Issue 38's architecture rows besides mixture of experts (tests/test_moe.py): product key
memory, Funnel Transformer, Weighted Transformer, transparent attention; each one's defining
behaviour, cached decoding through each variant, and the config rules."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from t5lite.config import ModelConfig
from t5lite.errors import UserError
from t5lite.models import build_model, check, dummy_batch, funnel, pkm, transparent
from t5lite.models import weighted
from model_checks import assert_cached_decoding_equals_full_forward
from numerics import assert_close_at_scale

KEY = functools.partial(jax.random.key, impl="rbg")
B, N_IN, N_TGT = 2, 8, 6


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                num_encoder_layers=3, num_decoder_layers=3, dropout_rate=0.0, max_length=32)
    base.update(kw)
    return ModelConfig(**base)


def batch_for(cfg, seed=0):
    batch = dummy_batch(cfg, B, {"inputs": N_IN, "targets": N_TGT})
    rng = np.random.default_rng(seed)
    for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens"):
        batch[k] = rng.integers(1, cfg.vocab_size, batch[k].shape).astype(np.int32)
    batch["encoder_input_tokens"][1, -2:] = 0  # padding in the second row
    batch["encoder_segment_ids"][1, -2:] = 0
    return batch


def init(cfg, batch):
    model = build_model(cfg)
    return model, nn.meta.unbox(jax.jit(model.init)(KEY(0), batch)["params"])


def encode(model, params, tokens):
    return jax.jit(lambda p, t: model.apply({"params": p}, t, method="encode"))(params, tokens)


def test_product_key_memory_reads_the_exact_top_slots():
    """The two-stage product-key search finds the same top-k slots of all N^2 products as a
    brute-force search, and the output is their softmax-weighted values summed over heads."""
    cfg = tiny(ffn_layer="pkm", pkm_keys=6, pkm_heads=2, pkm_knn=3, pkm_key_dim=8)
    x_BLD = jax.random.normal(KEY(1), (2, 5, 16))
    layer = pkm.ProductKeyMemory(cfg)
    params = nn.meta.unbox(layer.init(KEY(2), x_BLD)["params"])
    got = np.asarray(layer.apply({"params": params}, x_BLD))
    q = jnp.einsum("bld,dn->bln", x_BLD, params["query"]["kernel"]) + params["query"][
        "bias"].reshape(-1)
    q = np.asarray(q).reshape(2, 5, 2, 2, 4)  # [B, L, H, halves, K]
    q = q - q.mean(-1, keepdims=True)
    q = q / np.sqrt((q ** 2).mean(-1, keepdims=True) + 1e-6)
    q = q * np.asarray(params["query_norm_scale"]) + np.asarray(params["query_norm_bias"])
    keys, values = np.asarray(params["keys"]), np.asarray(params["values"])
    want = np.zeros_like(got)
    for b in range(2):
        for t in range(5):
            for h in range(2):
                s1, s2 = keys[h, 0] @ q[b, t, h, 0], keys[h, 1] @ q[b, t, h, 1]
                full = (s1[:, None] + s2[None, :]).reshape(-1)  # slot i1 * N + i2
                top = np.argsort(-full)[:3]
                w = np.exp(full[top] - full[top].max())
                want[b, t] += (w / w.sum()) @ values[top]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_funnel_pools_the_encoder_by_two_per_block():
    """Blocks (1, 1, 1): the encoder output has a quarter of the input length, each pooled
    position the mean of its window; the pooled context's mask is the mask of every 2nd id."""
    cfg = tiny(funnel_blocks=(1, 1, 1))
    batch = batch_for(cfg)
    model, params = init(cfg, batch)
    encoded = encode(model, params, batch["encoder_input_tokens"])
    assert encoded.shape == (B, N_IN // 4, 16)
    x = jnp.arange(2 * 8 * 3, dtype=jnp.float32).reshape(2, 8, 3)
    np.testing.assert_allclose(funnel.mean_pool(x, 2), (x[:, ::2] + x[:, 1::2]) / 2)
    assert [funnel.pool_at(cfg, "encoder", i) for i in range(3)] == [1, 2, 2]
    assert funnel.pool_at(cfg, "decoder", 1) == 1
    tokens, segments = funnel.pool_ids(cfg, batch["encoder_input_tokens"],
                                       batch["encoder_segment_ids"])
    np.testing.assert_array_equal(tokens, batch["encoder_input_tokens"][:, ::4])
    with pytest.raises(UserError, match="divide"):
        funnel.mean_pool(jnp.zeros((1, 5, 2)), 2)


def test_funnel_mean_pool_matches_hf_funnel():
    """Hugging Face's FunnelAttentionStructure.pool_tensor (mean, stride 2, no separate [CLS])
    pools a sequence as funnel.mean_pool does. (HF's Funnel attention itself is Transformer-XL
    style relative attention, which this encoder-decoder does not use, as the paper's did not.)
    """
    torch = pytest.importorskip("torch")
    from transformers import FunnelConfig
    from transformers.models.funnel.modeling_funnel import FunnelAttentionStructure
    structure = FunnelAttentionStructure(FunnelConfig(separate_cls=False, truncate_seq=False,
                                                      pooling_type="mean"))
    x = np.random.default_rng(0).normal(size=(2, 8, 5)).astype(np.float32)
    want = structure.pool_tensor(torch.from_numpy(x), mode="mean", stride=2).numpy()
    assert_close_at_scale(funnel.mean_pool(jnp.asarray(x), 2), want)


def test_transparent_attention_weights_are_a_softmax_over_layers():
    """The encoder hands over [embeddings, layer 1 .. N-1 outputs, final output]; its last
    entry is the plain encoder's output. A decoder layer's memory is softmax(w) . outputs."""
    cfg = tiny(transparent_attention=True, scan_layers=False)
    batch = batch_for(cfg)
    model, params = init(cfg, batch)
    stacked = encode(model, params, batch["encoder_input_tokens"])
    assert stacked.shape == (B, 4, N_IN, 16)
    plain_cfg = tiny(scan_layers=False)
    plain = build_model(plain_cfg)
    plain_params = {k: v for k, v in params.items() if k != "decoder"}
    plain_params["decoder"] = {k: v for k, v in params["decoder"].items()}
    for i in range(3):
        layer = dict(params["decoder"][f"layers_{i}"])
        layer.pop("transparent_attention")
        plain_params["decoder"][f"layers_{i}"] = layer
    want = encode(plain, plain_params, batch["encoder_input_tokens"])
    np.testing.assert_allclose(stacked[:, -1], want, atol=1e-5)
    w = params["decoder"]["layers_1"]["transparent_attention"]["weights"]
    assert w.shape == (4,)
    mix = transparent.TransparentMemory(cfg)
    logits = jnp.asarray([0.5, -1.0, 2.0, 0.0])
    got = mix.apply({"params": {"weights": logits}}, stacked)
    p = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(got, np.einsum("n,bnsd->bsd", p, stacked), atol=1e-5)


def test_weighted_transformer_branches():
    """Each head: its own output projection, times kappa_h, through the one shared FFN, times
    alpha_h, summed; kappa and alpha are the raw U[0, 1) variables (Mesh TF never applied the
    reference's constraint). No separate FFN."""
    cfg = tiny(weighted_transformer=True, scan_layers=False)
    batch = batch_for(cfg)
    _, params = init(cfg, batch)
    assert "mlp" not in params["encoder"]["layers_0"]
    assert "branches" in params["decoder"]["layers_0"]["encoder_decoder_attention"]
    heads = jax.random.normal(KEY(3), (2, 5, 2, 8))
    layer = weighted.BranchedOutput(cfg)
    p = nn.meta.unbox(layer.init(KEY(4), heads)["params"])
    got = np.asarray(layer.apply({"params": p}, heads))
    kappa, alpha = (np.asarray(p[n]) for n in ("kappa", "alpha"))
    assert ((kappa >= 0) & (kappa < 1)).all() and ((alpha >= 0) & (alpha < 1)).all()
    want = 0
    for h in range(2):
        o = np.asarray(heads[:, :, h]) @ np.asarray(p["out"][h]) * kappa[h]
        ffn = np.maximum(o @ np.asarray(p["wi_kernel"]), 0) @ np.asarray(p["wo_kernel"])
        want = want + alpha[h] * ffn
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


VARIANTS = {
    "moe": dict(ffn_layer="moe", ffn_layer_every=2, num_experts=3,
                expert_capacity_factor=8.0),
    "switch": dict(ffn_layer="switch", num_experts=3, expert_capacity_factor=8.0),
    # routing groups across the batch's sequences (a decoding step groups the batch's tokens)
    "switch_grouped": dict(ffn_layer="switch", num_experts=3, expert_capacity_factor=8.0,
                           moe_group_size=16),
    "pkm": dict(ffn_layer="pkm", ffn_layer_at=(-2,), ffn_layer_stacks="decoder", pkm_keys=4,
                pkm_heads=2, pkm_knn=2, pkm_key_dim=8),
    "funnel": dict(funnel_blocks=(1, 1, 1)),
    "weighted": dict(weighted_transformer=True),
    "transparent": dict(transparent_attention=True),
}


# "switch" runs with --runslow only: switch_grouped decodes through the same routing code (the
# group reshape aside) and moe through the ungrouped reshape
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "switch" else n
                                  for n in VARIANTS])
def test_cached_decoding_equals_full_forward(name):
    """Prefill 2 tokens, then one at a time with the KV cache: the logits of one full pass
    (every variant keeps the decoder causal and reads the encoder output as it is)."""
    cfg = tiny(**VARIANTS[name])
    batch = batch_for(cfg)
    model, params = init(cfg, batch)
    assert_cached_decoding_equals_full_forward(model, params, batch, prefill=2)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_training_builds_the_variant(name):
    """The model training, evaluation and `t5lite compile` build (t5lite.peft.build_model,
    PEFT off) is the variant itself, parameter for parameter (it once built the Weighted
    Transformer with plain attention and no FFN at all)."""
    from t5lite import peft
    cfg = tiny(**VARIANTS[name])
    batch = batch_for(cfg)
    shapes = [jax.tree.map(jnp.shape, nn.meta.unbox(jax.eval_shape(
        functools.partial(b(cfg).init, deterministic=True), KEY(0), batch))["params"])
        for b in (build_model, peft.build_model)]
    assert shapes[0] == shapes[1]


@pytest.mark.parametrize("fields, match", [
    (dict(funnel_blocks=(2, 2)), "adding up"),
    (dict(funnel_blocks=(1, 2), architecture="decoder_only"), "pools an encoder"),
    (dict(transparent_attention=True, architecture="decoder_only"), "encoder_decoder"),
    (dict(ffn_layer="pkm", ffn_layer_at=(5,)), "not a layer"),
    (dict(ffn_layer="switch", num_experts=1), "num_experts >= 2"),
    (dict(ffn_init_scale=0.1, init_std=0.02), "init_std=0"),
    # the kernels' bias objects are not mask arrays a Funnel encoder can pool (it failed in
    # funnel.pool_context with an AttributeError before this rule)
    (dict(funnel_blocks=(1, 1, 1), attention_kernel="flash"), "pools the encoder's attention"),
])
def test_config_rules(fields, match):
    with pytest.raises(UserError, match=match):
        check(tiny(**fields))
