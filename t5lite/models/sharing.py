"""Block sharing across depth: ALBERT's one set of layer weights reused at every layer of a
stack (Lan et al. 2020; Narang et al. 2021's block-sharing rows), and the Universal
Transformer's shared block applied ``model.universal_steps`` times with a learned embedding of
the step added before each application (Dehghani et al. 2019, without its adaptive halting).

Narang et al.'s Universal Transformer row ran Mesh TF's UTLayerStack (universal_transformer.gin:
recurrence_type "basic", so no halting), which adds two things this module follows when asked:
``model.universal_mix_layers`` more applications of the same block before and after the steps
(mix_with_transformer_before_ut / _after_ut, 2 each; no step embedding there), and
``model.universal_gating="gru"``: each sub-layer's output y is gated against the sub-layer's
input x before the residual add, x + dropout(GRU(x, y)) (use_gated_transformer, gating_type
"gru"). Its three gates (update, reset, candidate) are sigmoid dense layers with bias over the
normalized [x, y] (2D -> D) and their one norm; the block owns them, so they are shared across
the steps, as the reference's variable scopes share them: 3 x (2D * D + D) + 2D parameters a
sub-layer (2 in an encoder block, 3 in a decoder block), 17.7M at the paper's d_model 768.

Shapes: B batch, L length, D embed, N applications.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import layers as L


def shares_block(cfg, kind: str) -> bool:
    """Whether the ``kind`` ("encoder" / "decoder") stack reuses one block at every layer."""
    return bool(cfg.universal_steps or getattr(cfg, f"share_{kind}_block"))


def applications(cfg, kind: str) -> int:
    """How many times the shared block runs: universal_steps (and the mix layers before and
    after them), else the stack's depth."""
    depth = cfg.num_encoder_layers if kind == "encoder" else cfg.num_decoder_layers
    if cfg.universal_steps:
        return cfg.universal_steps + 2 * cfg.universal_mix_layers
    return depth


class GRUGate(nn.Module):
    """UTLayerStack's "gru" gating of a sub-layer's output y against its input x: update u,
    reset r and candidate c are sigmoid(dense([norm(a), norm(b)])); -> (1 - u) y + u c with
    u over (x, y), r over (norm(x), norm(y)) normalized again (the reference normalizes the
    list it already normalized in place), c over (r x, y)."""

    cfg: object

    @nn.compact
    def __call__(self, x_BLD, y_BLD):
        cfg = self.cfg
        norm = L.make_norm(cfg, "norm")  # one norm for every input: one scope in the reference

        def gate(name, a_BLD, b_BLD):
            dense = L.make_dense(cfg, cfg.d_model, ("mlp", "embed"), True, name=name)
            logits_BLD = dense(jnp.concatenate([a_BLD, b_BLD], axis=-1))
            return jax.nn.sigmoid(logits_BLD.astype(jnp.float32)).astype(y_BLD.dtype)

        nx_BLD, ny_BLD = norm(x_BLD), norm(y_BLD)
        update_BLD = gate("update", nx_BLD, ny_BLD)
        reset_BLD = gate("reset", norm(nx_BLD), norm(ny_BLD))
        candidate_BLD = gate("candidate", norm(reset_BLD * x_BLD), ny_BLD)
        return (1 - update_BLD) * y_BLD + update_BLD * candidate_BLD


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
        cfg, steps_ND = self.cfg, None
        if cfg.universal_steps:
            steps_ND = self.param("step_embedding", nn.with_logical_partitioning(
                nn.initializers.normal(1.0), ("layers", "embed")),
                (cfg.universal_steps, cfg.d_model), jnp.float32)
            mix_MD = jnp.zeros((cfg.universal_mix_layers, cfg.d_model), jnp.float32)
            steps_ND = jnp.concatenate([mix_MD, steps_ND, mix_MD])  # x + 0: no step embedding
        scanned = nn.scan(_Step, variable_broadcast="params", variable_axes={"cache": 0},
                          split_rngs={"params": False, "dropout": True},
                          in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), length=self.n)
        x_BLD, _ = scanned(self.block, self.fields, name="shared")(
            x_BLD, steps_ND, ctx, deterministic, decode)
        return (x_BLD, None) if self.scanned else x_BLD
