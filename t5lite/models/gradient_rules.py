"""Backend-specific gradient rules, chosen explicitly by ``model.gradient_rules``.

The model's math is the same on every backend; only how some of its gradients are written
differs. XLA:CPU runs autodiff's form of a few gradients badly (a transposed copy of the output
gradient before a weight gradient, a batch reduce it runs far slower than the same sum as a
matmul), so the "cpu" rules give those operations hand-written VJPs with the same numbers.
On accelerators (TPU, GPU) autodiff's form leaves XLA free to fuse and lay out the matmuls,
and elementwise functions recompute in the backward pass instead (memory is the limit there).

Every function here takes the rules choice (a ``GRADIENT_RULES`` value) as an argument: no
global state. "auto" means the default backend at trace time (``resolve``), which is "cpu" on
a CPU host that compiles for an abstract TPU topology; the TPU compile path therefore sets
``model.gradient_rules="accelerator"`` in its config.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

GRADIENT_RULES = ("auto", "cpu", "accelerator")


def resolve(rules: str) -> str:
    """"cpu" or "accelerator": the rules a model traced now uses; "auto" reads the default
    backend (the one place that does)."""
    if rules == "auto":
        return "cpu" if jax.default_backend() == "cpu" else "accelerator"
    if rules not in GRADIENT_RULES:
        raise ValueError(f"gradient rules must be one of {GRADIENT_RULES}, got {rules!r}")
    return rules


def uses_cpu_rules(rules: str) -> bool:
    return resolve(rules) == "cpu"


def dot(x, w, n_in: int = 1, tied: bool = False, rules: str = "auto"):
    """x [..., *in] . w [*in, *out] (tied: x [..., D] . w^T with w = E [V, D])."""
    if uses_cpu_rules(rules):
        return dense_dot(x, w, n_in, tied)
    return _plain_dot(x, w, n_in, tied)


def recompute_in_backward(fn, rules: str = "auto"):
    """``fn`` (elementwise: a norm, an activation) whose backward pass recomputes its inside
    from its inputs instead of keeping every intermediate (jax.checkpoint). Autodiff keeps
    them all (an RMSNorm several float32 copies of its [B, L, D] input, tanh-GeLU several
    [B, L, F] arrays). XLA drops such residuals itself when the layers are unrolled, but not
    across a scanned layer's loop boundary, where they become stacked [layers, ...] buffers.
    Not with the CPU rules, where memory is not the limit and the recompute costs step time."""
    return fn if uses_cpu_rules(rules) else jax.checkpoint(fn)


def add_position_bias(mask_B1TS, pos_XHTS, rules: str = "auto"):
    """mask [B, 1, T, S] + position bias [1 or B, H, T, S] -> [B, H, T, S].

    Autodiff would sum the position bias gradient over the batch with a reduce, which XLA:CPU
    runs much slower than the same sum written as a matmul with a ones vector; the CPU rule's
    gradient is that matmul. Same numbers (float32 sums in another order)."""
    if not uses_cpu_rules(rules):
        return mask_B1TS + pos_XHTS
    return _add_bias(mask_B1TS.shape[1] == 1, pos_XHTS.shape[0] == 1, mask_B1TS, pos_XHTS)


def _plain_dot(x, w, n_in: int, tied: bool):
    if tied:
        return jnp.einsum("...d,vd->...v", x, w)
    contract = tuple(range(x.ndim - n_in, x.ndim))
    return jax.lax.dot_general(x, w, ((contract, tuple(range(n_in))), ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def dense_dot(x, w, n_in: int = 1, tied: bool = False):
    """x [..., *in] . w [*in, *out], contracting x's trailing n_in dims; tied: x [..., D] . w^T
    with w = E [V, D] (the tied output layer).

    Same math as dot_general (the CPU rule of ``dot``); the hand-written gradient computes dw
    as one 2-D matmul with the [tokens, *out] output gradient as the left operand, contracting
    its major (token) axis. Autodiff's form makes XLA:CPU first copy that gradient into a
    transposed [*out, tokens] buffer (for the vocabulary projection the largest tensor of a
    train step; in every layer, the MLP's).
    """
    return _plain_dot(x, w, n_in, tied)


def _dense_dot_fwd(x, w, n_in, tied):
    return dense_dot(x, w, n_in, tied), (x, w)


def _dense_dot_bwd(n_in, tied, residuals, g):
    x, w = residuals
    if tied:
        dx = jnp.einsum("...v,vd->...d", g, w)
        n_in, n_out = 1, 1
    else:
        n_out = w.ndim - n_in
        dx = jax.lax.dot_general(g, w, ((tuple(range(g.ndim - n_out, g.ndim)),
                                         tuple(range(n_in, w.ndim))), ((), ())))
    x_NI = x.reshape(-1, math.prod(x.shape[x.ndim - n_in:]))
    g_NO = g.reshape(-1, math.prod(g.shape[g.ndim - n_out:]))
    dw_OI = jax.lax.dot_general(g_NO, x_NI, (((0,), (0,)), ((), ())))
    dw = dw_OI if tied else dw_OI.T.reshape(w.shape)
    return dx.astype(x.dtype), dw.astype(w.dtype)


dense_dot.defvjp(_dense_dot_fwd, _dense_dot_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _add_bias(mask_broadcast, pos_broadcast, mask_B1TS, pos_XHTS):
    return mask_B1TS + pos_XHTS


def _add_bias_fwd(mask_broadcast, pos_broadcast, mask_B1TS, pos_XHTS):
    return mask_B1TS + pos_XHTS, None


def _sum_over(g_BHTS, axis: int):
    ones = jnp.ones((g_BHTS.shape[axis],), g_BHTS.dtype)
    spec = "bhts,b->hts" if axis == 0 else "bhts,h->bts"
    return jnp.expand_dims(jnp.einsum(spec, g_BHTS, ones), axis)


def _add_bias_bwd(mask_broadcast, pos_broadcast, _, g_BHTS):
    return (_sum_over(g_BHTS, 1) if mask_broadcast else g_BHTS,
            _sum_over(g_BHTS, 0) if pos_broadcast else g_BHTS)


_add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)
