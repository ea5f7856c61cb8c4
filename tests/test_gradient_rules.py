"""The hand-written gradient rules (t5lite/models/gradient_rules.py: the CPU rewrites of
DenseGeneral's and the position bias's gradients) against autodiff, and the choice between
the CPU and the accelerator rules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from train_helpers import random_model_batch

from t5lite.config import ElectraConfig, ModelConfig, PeftConfig
from t5lite import peft
from numerics import assert_trees_close_at_scale
from test_models import KEY, tiny


@pytest.mark.parametrize("x_shape,w_shape,n_in,tied", [
    ((2, 5, 6), (11, 6), 1, True),  # tied output layer: x . E^T
    ((2, 5, 6), (6, 11), 1, False),  # logits_dense / MLP
    ((2, 5, 6), (6, 3, 4), 1, False),  # q / k / v projections [D, H, K]
    ((2, 5, 3, 4), (3, 4, 6), 2, False),  # attention output [H, K, D]
])
def test_dense_dot_gradient_matches_autodiff(x_shape, w_shape, n_in, tied):
    """DenseGeneral's CPU gradient rule (2-D weight gradient) equals autodiff of dot_general."""
    from t5lite.models.gradient_rules import dense_dot
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x, w = jax.random.normal(kx, x_shape), jax.random.normal(kw, w_shape)
    out = jax.eval_shape(lambda x, w: dense_dot(x, w, n_in, tied), x, w)
    g = jax.random.normal(kg, out.shape)
    contract = tuple(range(x.ndim - n_in, x.ndim))

    def ref(x, w):
        if tied:
            return jnp.einsum("...d,vd->...v", x, w)
        return jax.lax.dot_general(x, w, ((contract, tuple(range(n_in))), ((), ())))
    ours = jax.grad(lambda x, w: jnp.sum(dense_dot(x, w, n_in, tied) * g), (0, 1))(x, w)
    want = jax.grad(lambda x, w: jnp.sum(ref(x, w) * g), (0, 1))(x, w)
    np.testing.assert_allclose(dense_dot(x, w, n_in, tied), ref(x, w), rtol=1e-5, atol=1e-5)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_shape,pos_shape", [
    ((3, 1, 4, 5), (1, 2, 4, 5)),  # training: one position bias for the batch
    ((3, 1, 4, 5), (3, 2, 4, 5)),  # decoding / prompt tuning: per-row positions
    ((3, 2, 4, 5), (1, 2, 4, 5)),  # prefix tuning: the mask already has the heads
])
@pytest.mark.parametrize("rules", ["cpu", "accelerator"])
def test_add_position_bias_gradient_matches_autodiff(mask_shape, pos_shape, rules):
    """The mask + position bias add (CPU rule: batch sum as a matmul) equals autodiff."""
    from t5lite.models.gradient_rules import add_position_bias
    km, kp, kg = jax.random.split(jax.random.key(0), 3)
    mask, pos = jax.random.normal(km, mask_shape), jax.random.normal(kp, pos_shape)
    g = jax.random.normal(kg, (3, 2, 4, 5))
    np.testing.assert_array_equal(add_position_bias(mask, pos, rules), mask + pos)
    ours = jax.grad(lambda m, p: jnp.sum(add_position_bias(m, p, rules) * g), (0, 1))(mask, pos)
    want = jax.grad(lambda m, p: jnp.sum((m + p) * g), (0, 1))(mask, pos)
    for a, b in zip(ours, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


GRADIENT_RULE_MODELS = {  # between them every module that takes model.gradient_rules
    "t5_peft": dict(architecture="encoder_decoder", ffn="geglu", tie_embeddings=False,
                    peft=PeftConfig(lora_rank=2, adapter_dim=4, prompt_tokens=2)),
    "bert_heads": dict(architecture="encoder_only", position="learned", norm="layernorm",
                       use_bias=True, pre_norm=False, embed_norm=True, num_token_types=2,
                       nsp_head=True, sbo_head=True, sbo_max_span_length=4, span_head=True),
    "electra": dict(architecture="encoder_only", position="learned", norm="layernorm",
                    use_bias=True, pre_norm=False, embed_norm=True, embed_dim=16,
                    electra=ElectraConfig(rtd_head=True, generator_d_model=16)),
}


@pytest.mark.parametrize("name", sorted(GRADIENT_RULE_MODELS))
def test_cpu_and_accelerator_gradient_rules_give_the_same_gradients(name):
    """model.gradient_rules chooses the backend's gradient forms explicitly, so the accelerator
    rules (TPU / GPU) run on this CPU host too: a train step's gradients are the same under
    both, and only the CPU rules add custom VJPs (every layer got the model's choice; none
    fell back to "auto", which is "cpu" here)."""
    grads = {}
    for rules in ("cpu", "accelerator"):
        cfg = tiny(num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0,
                   gradient_rules=rules, **GRADIENT_RULE_MODELS[name])
        model = peft.build_model(cfg)  # the core model when PEFT is off
        batch = random_model_batch(cfg, 2, 8, 6)
        params = nn.meta.unbox(jax.jit(model.init)(KEY(0), batch)["params"])

        def loss(p):
            out = model.apply({"params": p}, batch)
            return sum(jnp.sum(jnp.sin(v)) for _, v in sorted(out.items())
                       if v.dtype == jnp.float32)

        traced = jax.jit(jax.grad(loss)).trace(params)
        assert ("custom_vjp_call" in str(traced.jaxpr)) == (rules == "cpu"), rules
        grads[rules] = traced.lower().compile()(params)
    assert_trees_close_at_scale(grads["cpu"], grads["accelerator"])


def test_gradient_rules_choices_and_auto():
    """The config field's choices are the module's; "auto" is the default backend's rules."""
    import dataclasses

    from t5lite.models import gradient_rules
    field = {f.name: f for f in dataclasses.fields(ModelConfig)}["gradient_rules"]
    assert field.metadata["choices"] == gradient_rules.GRADIENT_RULES
    assert ModelConfig().gradient_rules == "auto"
    assert gradient_rules.resolve("auto") == "cpu"  # JAX_PLATFORMS=cpu
    assert gradient_rules.resolve("accelerator") == "accelerator"
    with pytest.raises(ValueError):
        gradient_rules.resolve("tpu")
