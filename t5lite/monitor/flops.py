"""The one matmul FLOP count and the one tokens-per-step definition.

Training logs (MFU, tokens/s), `t5lite compile` (est. tokens/s, MFU) and the ablation estimate
all count through here, so their numbers describe the same work.

Tokens of a training step, by architecture (the tokens the model reads per row):
- encoder_decoder: inputs + targets (encoder input and decoder row);
- decoder_only / prefix_lm: the decoder row (targets; prefix_lm packs inputs + targets into it);
- encoder_only: the inputs (the MLM targets are the same positions, not more tokens).

jax is imported inside the functions that trace: the tokens count is used by code that must
stay light (the ablation estimate).
"""

from __future__ import annotations

import math

# The features whose non-padding tokens a batch counts, per the definition above: the encoder
# input, the decoder row, and the encoder targets only where no encoder input exists.
_COUNTED_FEATURES = ("encoder_input_tokens", "decoder_target_tokens", "encoder_target_tokens")


def row_tokens(architecture: str, feature_lengths: dict) -> int:
    """Tokens one row of a training batch holds (see the module docstring)."""
    inputs, targets = feature_lengths.get("inputs", 0), feature_lengths.get("targets", 0)
    if architecture in ("encoder_decoder", "prefix_lm"):
        return inputs + targets
    if architecture == "encoder_only":
        return inputs
    return targets


def tokens_per_step(cfg) -> int:
    """Tokens a training step reads: batch x row_tokens (padding included)."""
    return cfg.data.batch_size * row_tokens(cfg.model.architecture, cfg.data.feature_lengths)


def batch_tokens(host_batch: dict) -> int:
    """Non-padding tokens of one host batch, by the same definition as tokens_per_step."""
    import numpy as np
    keys = [k for k in _COUNTED_FEATURES if k in host_batch and not (
        k == "encoder_target_tokens" and "encoder_input_tokens" in host_batch)]
    return sum(int(np.count_nonzero(host_batch[k])) for k in keys)


def dot_flops(eqn) -> int:
    """2 x multiply-adds of one dot_general equation."""
    lhs = eqn.invars[0].aval
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    contract = math.prod(lhs.shape[d] for d in lhs_contract)
    return 2 * math.prod(eqn.outvars[0].aval.shape) * contract


def jaxpr_matmul_flops(jaxpr) -> int:
    """The jaxpr's matmul FLOPs, scan bodies times their length (remat recompute included)."""
    import jax.extend as jex
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            total += dot_flops(eqn)
        trips = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for sub in jex.core.jaxprs_in_params(eqn.params):
            total += trips * jaxpr_matmul_flops(sub)
    return total


def matmul_flops(fn, *args, **kwargs) -> int:
    """FLOPs of every matmul (dot_general) in fn's forward pass, counted from its jaxpr
    (scanned layers multiplied by their length). Exact for any architecture and lengths."""
    import jax
    closed = jax.make_jaxpr(fn)(*args, **kwargs)
    return jaxpr_matmul_flops(closed.jaxpr)
