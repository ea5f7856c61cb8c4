"""Block sharing across depth: ALBERT's one set of layer weights reused at every layer of a
stack (Lan et al. 2020; Narang et al. 2021's block-sharing rows), and the Universal
Transformer's shared block applied ``model.universal_steps`` times with a learned embedding of
the step added before each application (Dehghani et al. 2019, without its adaptive halting).

The shared block is one Block scanned with its params broadcast (one copy, no ``layers``
axis) and its decoding cache stacked per application, so KV-cached decoding keeps one cache
per step.

Shapes: B batch, L length, D embed, N applications.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


def shares_block(cfg, kind: str) -> bool:
    """Whether the ``kind`` ("encoder" / "decoder") stack reuses one block at every layer."""
    return bool(cfg.universal_steps or getattr(cfg, f"share_{kind}_block"))


def applications(cfg, kind: str) -> int:
    """How many times the shared block runs: universal_steps, else the stack's depth."""
    depth = cfg.num_encoder_layers if kind == "encoder" else cfg.num_decoder_layers
    return cfg.universal_steps or depth


class _Step(nn.Module):
    """One application: (+ the step's embedding) then the block (built scanned: it returns
    (x, None), the scan's carry and output)."""

    block: type
    fields: dict

    @nn.compact
    def __call__(self, x_BLD, step_D, ctx, deterministic, decode):
        if step_D is not None:
            x_BLD = x_BLD + step_D.astype(x_BLD.dtype)
        return self.block(**self.fields, scanned=True, name="block")(
            x_BLD, ctx, deterministic, decode)


class SharedBlocks(nn.Module):
    """``n`` applications of one Block (class ``block``, built with ``fields``); called like a
    Stack's layers: x_BLD -> (x_BLD, None) as its scanned stack (``scanned``), else x_BLD as
    one layer of its list."""

    cfg: object
    block: type
    fields: dict
    n: int
    scanned: bool = True

    @nn.compact
    def __call__(self, x_BLD, ctx, deterministic=True, decode=False):
        steps_ND = None
        if self.cfg.universal_steps:
            steps_ND = self.param("step_embedding", nn.with_logical_partitioning(
                nn.initializers.normal(1.0), ("layers", "embed")),
                (self.n, self.cfg.d_model), jnp.float32)
        scanned = nn.scan(_Step, variable_broadcast="params", variable_axes={"cache": 0},
                          split_rngs={"params": False, "dropout": True},
                          in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), length=self.n)
        x_BLD, _ = scanned(self.block, self.fields, name="shared")(
            x_BLD, steps_ND, ctx, deterministic, decode)
        return (x_BLD, None) if self.scanned else x_BLD
