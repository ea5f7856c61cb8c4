"""Model checks shared by the test files that build their own model variants."""

import jax
import numpy as np

from t5lite.models import init_cache


def assert_cached_decoding_equals_full_forward(model, params, batch, prefill: int):
    """Decoding with the KV cache (``prefill`` tokens in one call, then one token a call) gives
    the logits of one full forward pass over ``batch``'s decoder input tokens: a variant that
    keeps the decoder causal and reads the encoder output as it is decodes what it trains on."""
    full = jax.jit(lambda p, b: model.apply({"params": p}, b)["logits"])(params, batch)
    tokens = batch["decoder_input_tokens"]
    inputs, kwargs = batch.get("encoder_input_tokens"), {}
    if model.cfg.architecture == "encoder_decoder":
        encoded = jax.jit(lambda p, t: model.apply({"params": p}, t, method="encode"))(
            params, inputs)
        kwargs = dict(encoded=encoded, encoder_input_tokens=inputs)
    cache = init_cache(model, params, tokens.shape[0], tokens.shape[1], inputs)

    @jax.jit
    def step(cache, chunk):
        return model.apply({"params": params, "cache": cache}, chunk, decode=True,
                           mutable=["cache"], method="decode", **kwargs)

    outs = []
    for lo, hi in [(0, prefill)] + [(i, i + 1) for i in range(prefill, tokens.shape[1])]:
        logits, mutated = step(cache, tokens[:, lo:hi])
        cache = mutated["cache"]
        outs.append(logits)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-4, rtol=1e-4)
