"""Transparent attention (Bapna et al. 2018) as the paper codebase built it (Mesh TensorFlow
TransparentEncDecAttention): the encoder hands the decoder every layer's output, [B, N+1, S,
D] (the embeddings, layers 1 .. N-1's residual stream, the final normalised output), and
decoder layer j cross-attends to sum_i softmax(w_j)_i * output_i with its own learned logits
w_j [N+1] (initialised N(0, (N+1)^-1/2), dropped out at model.dropout_rate). The reference
holds all w_j as one [N+1, decoder layers] matrix with the softmax over the encoder axis; one
row per decoder layer is the same function.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import layers as L


class TransparentMemory(nn.Module):
    """A decoder layer's cross-attention memory from the stacked encoder outputs."""

    cfg: object

    @nn.compact
    def __call__(self, encoded_BNSD, deterministic=True):
        n = encoded_BNSD.shape[1]
        logits_N = self.param("weights", nn.with_logical_partitioning(
            nn.initializers.normal(n ** -0.5), ("encoder_layers",)), (n,), jnp.float32)
        logits_N = nn.Dropout(self.cfg.dropout_rate)(logits_N, deterministic=deterministic)
        weights_N = jax.nn.softmax(logits_N).astype(encoded_BNSD.dtype)
        memory_BSD = jnp.einsum("n,bnsd->bsd", weights_N, encoded_BNSD)
        return L.constrain(memory_BSD, ("batch", "length", "embed"))


def stack_outputs(outputs):
    """[embeddings, layer outputs ..., final output] (each [B, S, D]) -> [B, N+1, S, D]."""
    return L.constrain(jnp.stack(outputs, axis=1), ("batch", "encoder_layers", "length",
                                                    "embed"))
