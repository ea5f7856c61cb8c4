"""What the bf16 attention backward stores for the position-bias gradient (issue 34 item 1).

The relative position bias is shared by every layer of a stack, so its gradient sums each
layer's logits gradient over the batch. XLA (TPU) schedules those sums at the end of the
backward pass, off the critical path, and keeps whatever they read alive until then, one
[B, H, T, S] array set per layer: the stored probabilities and their gradient (2 x bf16) when
the sum re-derives the float32 logits gradient from them, against t5x's one bf16 array. These
tests pin that the sum reads one stored bf16 logits gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from t5lite import config as config_lib
from t5lite.models import build_model, dummy_batch, layers


def _equations(jaxpr):
    """Every equation of a jaxpr and of the jaxprs nested in it (jit, remat, custom rules)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jax.extend.core.Jaxpr):
                    yield from _equations(inner)


def test_softmax_gradient_leaves_in_the_compute_dtype():
    x = 3 * jax.random.normal(jax.random.key(0), (2, 3, 5, 7))
    g = jax.random.normal(jax.random.key(1), x.shape)
    grad = jax.grad(lambda x: (layers.softmax_to(x, jnp.bfloat16).astype(jnp.float32)
                               * g).sum())(x)
    np.testing.assert_array_equal(grad, grad.astype(jnp.bfloat16).astype(jnp.float32))
    ref = jax.grad(lambda x: (jax.nn.softmax(x, -1).astype(jnp.bfloat16).astype(jnp.float32)
                              * g).sum())(x)
    np.testing.assert_allclose(grad, ref, atol=1e-2 * float(jnp.abs(ref).max()))


def test_position_bias_gradient_sums_a_stored_bf16_logits_gradient():
    b, h, t = 2, 4, 16
    cfg = config_lib.load_config("t5_1_1_tiny", [
        "model.dtype=bfloat16", "model.scan_layers=false", "model.num_encoder_layers=2",
        "model.num_decoder_layers=1", f"model.num_heads={h}", "model.vocab_size=128",
        "model.remat=none", "model.gradient_rules=accelerator"]).model
    model = build_model(cfg)
    batch = dummy_batch(cfg, b, {"inputs": t, "targets": t})
    params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), batch)["params"])

    def loss(p):
        return model.apply({"params": p}, batch)["logits"].astype(jnp.float32).sum()

    jaxpr = jax.make_jaxpr(jax.grad(loss))(params).jaxpr
    eqns = list(_equations(jaxpr))
    producer = {v: e for e in eqns for v in e.outvars}
    # the relative bias [1, H, T, S] broadcast over the batch: its gradient is a sum over
    # axis 0 of a [B, H, T, S] logits gradient, one per layer with self-attention
    sums = [e for e in eqns if e.primitive.name == "reduce_sum" and e.params["axes"] == (0,)
            and tuple(e.invars[0].aval.shape) == (b, h, t, t)]
    assert len(sums) == 3, [str(e) for e in sums]  # 2 encoder layers, 1 decoder layer
    for e in sums:
        src = producer[e.invars[0]]
        assert src.primitive.name == "convert_element_type", str(src)
        stored = producer[src.invars[0]]
        assert stored.primitive.name == "optimization_barrier", str(stored)
        assert src.invars[0].aval.dtype == jnp.bfloat16
