"""Pallas TPU kernels of flash attention with the position bias made inside the kernel: the
forward pass (online softmax) and the two backward passes (dk, dv and the bias table's
gradient; dq), in the blocking of Dao et al.'s FlashAttention-2.

Layout: q [B, H, T, K], k / v [B, H, S, K] (T, S multiples of the blocks); segment ids
lane-replicated as q [B, T, 128] and kv [B, 8, S] int32 (0 = padding), the form whose tiles
TPU loads without relayout; the softmax statistics lane-replicated as [.., bq, 128]. The
model's query is already scaled (T5 folds the scale into its init), so no scale here. Masked
logits get the model's additive NEG_INF (layers.py), so a row's softmax is the model's.
A causal kernel skips the tiles above the diagonal and its index maps repeat the last needed
block there, so the pipeline fetches nothing for them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from t5lite.models import flash_bias
from t5lite.models.layers import NEG_INF

LANES = 128  # TPU vector lanes: the minor tile dim
SUBLANES = 8
_NT = (((1,), (1,)), ((), ()))  # a [m, k] . b [n, k] -> [m, n]
_TN = (((0,), (0,)), ((), ()))  # a [k, m] . b [k, n] -> [m, n]


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What the kernels are specialised on (static)."""

    kind: str = "none"  # position bias: none | relative | alibi
    causal: bool = False
    num_runs: int = 0  # relative: len(flash_bias.bucket_runs(...))
    num_buckets: int = 0
    block_q: int = 512
    block_k: int = 512
    interpret: bool = False  # always interpret (else: only where not lowered for TPU)


def _lanes(x_Q128, width: int):
    """A lane-replicated [bq, 128] statistic as [bq, width]."""
    if width <= LANES:
        return x_Q128[:, :width]
    return jnp.tile(x_Q128, (1, width // LANES))


def _runs(spec: KernelSpec, q0, k0):
    """Whether tile (q0, k0) has any key a query may see under the causal rule."""
    return k0 <= q0 + spec.block_q - 1 if spec.causal else True


def _logits(spec, table_ref, runs_ref, head, q, k, qseg_ref, kseg_ref, q0, k0):
    """s = q k^T + position bias, masked with NEG_INF: float32 [bq, bk]."""
    bq, bk = spec.block_q, spec.block_k
    s = jax.lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32)
    bias = flash_bias.bias_tile(table_ref, runs_ref, head, q0, k0, (bq, bk), spec.kind,
                                spec.num_runs, spec.num_buckets)
    if bias is not None:
        s = s + bias
    q_seg = _lanes(qseg_ref[...], bk)
    k_seg = kseg_ref[0:1, :]
    allowed = (q_seg == k_seg) & (k_seg != 0)
    if spec.causal:
        allowed &= flash_bias.relative_distance(q0, k0, (bq, bk)) <= 0
    return s + jnp.where(allowed, 0.0, NEG_INF)


def _fwd_kernel(table_ref, runs_ref, q_ref, k_ref, v_ref, qseg_ref, kseg_ref, o_ref,
                lse_ref, m_sc, l_sc, acc_sc, *, spec: KernelSpec):
    i, j = pl.program_id(2), pl.program_id(3)
    q0, k0, head = i * spec.block_q, j * spec.block_k, pl.program_id(1)

    @pl.when(j == 0)
    def _():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    @pl.when(_runs(spec, q0, k0))
    def _():
        s = _logits(spec, table_ref, runs_ref, head, q_ref[...], k_ref[...], qseg_ref,
                    kseg_ref, q0, k0)
        m_prev = m_sc[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - _lanes(m_next, spec.block_k))
        alpha = jnp.exp(m_prev - m_next)
        l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
        m_sc[...] = m_next
        v = v_ref[...]
        pv = jax.lax.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        acc_sc[...] = acc_sc[...] * _lanes(alpha, acc_sc.shape[1]) + pv

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        l = l_sc[...]
        o_ref[...] = (acc_sc[...] / _lanes(l, acc_sc.shape[1])).astype(o_ref.dtype)
        lse_ref[...] = m_sc[...] + jnp.log(l)


def _dkv_kernel(table_ref, runs_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, qseg_ref,
                kseg_ref, dk_ref, dv_ref, *rest, spec: KernelSpec):
    dtab_ref, dk_sc, dv_sc = rest if spec.kind == "relative" else (None, *rest)
    j, i = pl.program_id(2), pl.program_id(3)
    q0, k0, head = i * spec.block_q, j * spec.block_k, pl.program_id(1)

    @pl.when(i == 0)
    def _():
        dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

    if dtab_ref is not None:
        @pl.when((i == 0) & (j == 0))
        def _():
            dtab_ref[...] = jnp.zeros(dtab_ref.shape, jnp.float32)

    @pl.when(_runs(spec, q0, k0))
    def _():
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        s = _logits(spec, table_ref, runs_ref, head, q, k, qseg_ref, kseg_ref, q0, k0)
        p = jnp.exp(s - _lanes(lse_ref[...], spec.block_k))
        dv_sc[...] += jax.lax.dot_general(p.astype(do.dtype), do, _TN,
                                          preferred_element_type=jnp.float32)
        dp = jax.lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
        ds = p * (dp - _lanes(di_ref[...], spec.block_k))
        dk_sc[...] += jax.lax.dot_general(ds.astype(q.dtype), q, _TN,
                                          preferred_element_type=jnp.float32)
        if dtab_ref is not None:
            flash_bias.accumulate_table_grad(dtab_ref, runs_ref, ds, q0, k0, spec.num_runs)

    @pl.when(i == pl.num_programs(3) - 1)
    def _():
        dk_ref[...] = dk_sc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def _dq_kernel(table_ref, runs_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, qseg_ref,
               kseg_ref, dq_ref, dq_sc, *, spec: KernelSpec):
    i, j = pl.program_id(2), pl.program_id(3)
    q0, k0, head = i * spec.block_q, j * spec.block_k, pl.program_id(1)

    @pl.when(j == 0)
    def _():
        dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

    @pl.when(_runs(spec, q0, k0))
    def _():
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        s = _logits(spec, table_ref, runs_ref, head, q, k, qseg_ref, kseg_ref, q0, k0)
        p = jnp.exp(s - _lanes(lse_ref[...], spec.block_k))
        dp = jax.lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
        ds = p * (dp - _lanes(di_ref[...], spec.block_k))
        dq_sc[...] += jax.lax.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        dq_ref[...] = dq_sc[...].astype(dq_ref.dtype)


# ----------------------------------------------------------------------------- index maps
# Grid axes: (batch, head, outer block, inner block). For the forward and dq passes the outer
# block is a query block and the inner one a key block; for dk / dv the other way round.


def _last_k_block(spec, i):
    """The last key block query block i sees (causal); earlier ones are all needed. (lax.div:
    floor division of signed ints lowers to a sign op Mosaic resolves against the host's
    device; these are never negative.)"""
    return jax.lax.div((i + 1) * spec.block_q - 1, spec.block_k)


def _first_q_block(spec, j):
    """The first query block that sees key block j (causal)."""
    return jax.lax.div(j * spec.block_k, spec.block_q)


def _specs_q_outer(spec: KernelSpec, head_dim: int):
    """Block specs of q-side and k-side inputs when queries are the outer grid axis."""
    bq, bk = spec.block_q, spec.block_k

    def kj(i, j):
        return jnp.minimum(j, _last_k_block(spec, i)) if spec.causal else j

    q_side = pl.BlockSpec((None, None, bq, head_dim), lambda b, h, i, j, *_: (b, h, i, 0))
    k_side = pl.BlockSpec((None, None, bk, head_dim), lambda b, h, i, j, *_: (b, h, kj(i, j), 0))
    stat = pl.BlockSpec((None, None, bq, LANES), lambda b, h, i, j, *_: (b, h, i, 0))
    qseg = pl.BlockSpec((None, bq, LANES), lambda b, h, i, j, *_: (b, i, 0))
    kseg = pl.BlockSpec((None, SUBLANES, bk), lambda b, h, i, j, *_: (b, 0, kj(i, j)))
    return q_side, k_side, stat, qseg, kseg


def _specs_k_outer(spec: KernelSpec, head_dim: int):
    """Block specs of q-side and k-side inputs when keys are the outer grid axis."""
    bq, bk = spec.block_q, spec.block_k

    def qi(j, i):
        return jnp.maximum(i, _first_q_block(spec, j)) if spec.causal else i

    q_side = pl.BlockSpec((None, None, bq, head_dim), lambda b, h, j, i, *_: (b, h, qi(j, i), 0))
    k_side = pl.BlockSpec((None, None, bk, head_dim), lambda b, h, j, i, *_: (b, h, j, 0))
    stat = pl.BlockSpec((None, None, bq, LANES), lambda b, h, j, i, *_: (b, h, qi(j, i), 0))
    qseg = pl.BlockSpec((None, bq, LANES), lambda b, h, j, i, *_: (b, qi(j, i), 0))
    kseg = pl.BlockSpec((None, SUBLANES, bk), lambda b, h, j, i, *_: (b, 0, j))
    return q_side, k_side, stat, qseg, kseg


def _call(kernel, spec, grid, in_specs, out_specs, out_shape, scratch, semantics, cost):
    """The pallas_call: compiled by Mosaic where the program is lowered for TPU (also from a
    CPU host compiling for a TPU slice), interpreted elsewhere (CPU tests and runs)."""
    def call(interpret):
        return pl.pallas_call(
            kernel, out_shape=out_shape, interpret=interpret, cost_estimate=cost,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=grid, in_specs=in_specs, out_specs=out_specs,
                scratch_shapes=scratch),
            compiler_params=pltpu.CompilerParams(dimension_semantics=semantics))

    if spec.interpret:
        return call(True)
    return lambda *args: jax.lax.platform_dependent(*args, tpu=call(False), default=call(True))


def forward(spec: KernelSpec, table, runs, q, k, v, qseg, kseg, cost=None):
    """-> (out [B, H, T, K] in q's dtype, logsumexp [B, H, T, 128] float32)."""
    b, h, t, d = q.shape
    grid = (b, h, t // spec.block_q, k.shape[2] // spec.block_k)
    q_side, k_side, stat, qs, ks = _specs_q_outer(spec, d)
    out_shape = (jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, t, LANES), jnp.float32))
    scratch = [pltpu.VMEM((spec.block_q, LANES), jnp.float32),
               pltpu.VMEM((spec.block_q, LANES), jnp.float32),
               pltpu.VMEM((spec.block_q, d), jnp.float32)]
    return _call(functools.partial(_fwd_kernel, spec=spec), spec, grid,
                 [q_side, k_side, k_side, qs, ks], [q_side, stat], out_shape, scratch,
                 ("parallel", "parallel", "parallel", "arbitrary"), cost)(
                     table, runs, q, k, v, qseg, kseg)


def backward_dkv(spec: KernelSpec, table, runs, q, k, v, do, lse, di, qseg, kseg, cost=None):
    """-> (dk, dv [B, H, S, K], and for a relative bias its table's gradient as
    [B, H, N_pad, 128] lane-replicated rows)."""
    b, h, t, d = q.shape
    grid = (b, h, k.shape[2] // spec.block_k, t // spec.block_q)
    q_side, k_side, stat, qs, ks = _specs_k_outer(spec, d)
    out_specs = [k_side, k_side]
    out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    semantics = ("parallel", "parallel", "parallel", "arbitrary")
    if spec.kind == "relative":  # one accumulator per (batch, head) across all tiles
        n_pad = -(-spec.num_buckets // SUBLANES) * SUBLANES
        out_specs.append(pl.BlockSpec((None, None, n_pad, LANES), lambda b, h, j, i, *_:
                                      (b, h, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((b, h, n_pad, LANES), jnp.float32))
        semantics = ("parallel", "parallel", "arbitrary", "arbitrary")
    scratch = [pltpu.VMEM((spec.block_k, d), jnp.float32)] * 2
    return _call(functools.partial(_dkv_kernel, spec=spec), spec, grid,
                 [q_side, k_side, k_side, q_side, stat, stat, qs, ks], out_specs, out_shape,
                 scratch, semantics, cost)(table, runs, q, k, v, do, lse, di, qseg, kseg)


def backward_dq(spec: KernelSpec, table, runs, q, k, v, do, lse, di, qseg, kseg, cost=None):
    """-> dq [B, H, T, K]."""
    b, h, t, d = q.shape
    grid = (b, h, t // spec.block_q, k.shape[2] // spec.block_k)
    q_side, k_side, stat, qs, ks = _specs_q_outer(spec, d)
    return _call(functools.partial(_dq_kernel, spec=spec), spec, grid,
                 [q_side, k_side, k_side, q_side, stat, stat, qs, ks], q_side,
                 jax.ShapeDtypeStruct(q.shape, q.dtype),
                 [pltpu.VMEM((spec.block_q, d), jnp.float32)],
                 ("parallel", "parallel", "parallel", "arbitrary"), cost)(
                     table, runs, q, k, v, do, lse, di, qseg, kseg)
