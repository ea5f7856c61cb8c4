"""Pallas GPU (Triton) kernels of flash attention with T5's bucketed relative bias (or ALiBi)
made inside the kernel: the GPU twin of flash_kernels.py (``model.attention_kernel=
"flash_gpu"``).

Triton blocking (one program per query block for the forward and dq passes, per key block for
dk / dv), not TPU's: a program loops over the other axis itself, so no grid axis is
"arbitrary" and nothing needs scalar prefetch (the Triton backend has none). The bias and its
gradient reuse flash_bias.py's runs of distances (the model's own bucket function evaluated
once at trace time): a tile's bias is a chain of selects over the run starts inside the
tile's distances, reading the [H * N] table by scalar loads; the dk / dv program sums the
logits gradient per bucket into a [N_pad] vector per (batch, head, key block), summed outside.

Layout: the model's own, q [B, T, H, K], k / v [B, S, H, K] (T, S multiples of the blocks, the
wrapper pads); segment ids [B, T] / [B, S] int32 (0 = padding); softmax statistics [B, H, T]
float32. No scale (T5 folds it into the query init; GPT's query arrives scaled). Masked logits
get the model's additive NEG_INF, so a row's softmax is the model's. Off GPU the kernels run
in Pallas interpret mode (exact, slow: CPU tests).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from t5lite.models import flash_bias
from t5lite.models.layers import NEG_INF

_NT = (((1,), (1,)), ((), ()))  # a [m, k] . b [n, k] -> [m, n]
_TN = (((0,), (0,)), ((), ()))  # a [k, m] . b [k, n] -> [m, n]


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """What the kernels are specialised on (static). Blocks: powers of two, at least 16 where
    they feed a Triton dot (tests in interpret mode may go lower)."""

    kind: str = "none"  # position bias: none | relative | alibi
    causal: bool = False
    num_runs: int = 0  # relative: len(flash_bias.bucket_runs(...))
    num_buckets: int = 0
    block_q: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 2
    interpret: bool = False  # always interpret (else: only where not lowered for a GPU)

    @property
    def buckets_padded(self) -> int:
        """The per-program table-gradient vector's length: a power of two (Triton)."""
        return max(16, 1 << max(self.num_buckets - 1, 0).bit_length())


def _logits(spec, table_ref, runs_ref, head, q, k, q_seg, k_seg, q0, k0):
    """s = q k^T + position bias, masked with NEG_INF: float32 [bq, bk]."""
    bq, bk = q.shape[0], k.shape[0]
    s = jax.lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32)
    bias = flash_bias.bias_tile(table_ref, runs_ref, head, q0, k0, (bq, bk), spec.kind,
                                spec.num_runs, spec.num_buckets)
    if bias is not None:
        s = s + bias
    allowed = (q_seg[:, None] == k_seg[None, :]) & (k_seg[None, :] != 0)
    if spec.causal:
        allowed &= flash_bias.relative_distance(q0, k0, (bq, bk)) <= 0
    return s + jnp.where(allowed, 0.0, NEG_INF)


def _key_blocks_end(spec, i, num_k: int):
    """One past the last key block query block i sees (causal: the diagonal's)."""
    if not spec.causal:
        return num_k
    return jnp.minimum(num_k, jax.lax.div((i + 1) * spec.block_q - 1, spec.block_k) + 1)


def _query_blocks_start(spec, j):
    """The first query block that sees key block j (causal), else 0."""
    return jax.lax.div(j * spec.block_k, spec.block_q) if spec.causal else 0


def table_grad_tile(acc_N, runs_ref, ds, q0, k0, num_runs: int):
    """acc_N[bucket] += the sum of the logits gradient ``ds`` [bq, bk] over the tile's entries
    in that bucket: sums over rel >= each run start inside the tile, differenced (a tile far
    from the diagonal is one run: one sum)."""
    lo, hi = flash_bias.tile_range(q0, k0, ds.shape)
    first = flash_bias._run_index(runs_ref, num_runs, lo)
    last = flash_bias._run_index(runs_ref, num_runs, hi)
    rel = flash_bias.relative_distance(q0, k0, ds.shape)
    rows = jax.lax.broadcasted_iota(jnp.int32, acc_N.shape, 0)

    def total(x):
        return jnp.sum(jnp.sum(x, axis=1), axis=0)

    def add(acc, run, value):
        return acc + jnp.where(rows == runs_ref[num_runs + run], value, 0.0)

    def step(n, carry):  # carry: (sum over rel >= start of run n - 1, accumulator)
        above, acc = carry
        here = total(jnp.where(rel >= runs_ref[n], ds, 0.0))
        return here, add(acc, n - 1, above - here)

    above, acc = jax.lax.fori_loop(first + 1, last + 1, step, (total(ds), acc_N))
    return add(acc, last, above)


def _fwd_kernel(table_ref, runs_ref, q_ref, k_ref, v_ref, qseg_ref, kseg_ref, o_ref, lse_ref,
                *, spec: GpuSpec):
    i, head = pl.program_id(0), pl.program_id(2)
    bq, bk, q0 = spec.block_q, spec.block_k, pl.program_id(0) * spec.block_q
    q, q_seg = q_ref[...], qseg_ref[...]

    def body(j, carry):
        acc, m_prev, l_prev = carry
        k0 = j * bk
        keys = pl.ds(k0, bk)
        s = _logits(spec, table_ref, runs_ref, head, q, k_ref[keys, :], q_seg, kseg_ref[keys],
                    q0, k0)
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1))
        p = jnp.exp(s - m_next[:, None])
        alpha = jnp.exp(m_prev - m_next)
        v = v_ref[keys, :]
        pv = jax.lax.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return acc * alpha[:, None] + pv, m_next, alpha * l_prev + jnp.sum(p, axis=1)

    init = (jnp.zeros((bq, q.shape[1]), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
            jnp.zeros((bq,), jnp.float32))
    end = _key_blocks_end(spec, i, k_ref.shape[0] // bk)
    acc, m, l = jax.lax.fori_loop(0, end, body, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def _dkv_kernel(table_ref, runs_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, qseg_ref,
                kseg_ref, dk_ref, dv_ref, *dtab_ref, spec: GpuSpec):
    j, head = pl.program_id(0), pl.program_id(2)
    bq, k0 = spec.block_q, pl.program_id(0) * spec.block_k
    k, v, k_seg = k_ref[...], v_ref[...], kseg_ref[...]

    def body(i, carry):
        dk, dv, dtab = carry
        q0 = i * bq
        rows = pl.ds(q0, bq)
        q, do = q_ref[rows, :], do_ref[rows, :]
        s = _logits(spec, table_ref, runs_ref, head, q, k, qseg_ref[rows], k_seg, q0, k0)
        p = jnp.exp(s - lse_ref[rows][:, None])
        dv = dv + jax.lax.dot_general(p.astype(do.dtype), do, _TN,
                                      preferred_element_type=jnp.float32)
        dp = jax.lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
        ds = p * (dp - di_ref[rows][:, None])
        dk = dk + jax.lax.dot_general(ds.astype(q.dtype), q, _TN,
                                      preferred_element_type=jnp.float32)
        if dtab_ref:
            dtab = table_grad_tile(dtab, runs_ref, ds, q0, k0, spec.num_runs)
        return dk, dv, dtab

    zeros = jnp.zeros(k.shape, jnp.float32)
    init = (zeros, zeros, jnp.zeros((spec.buckets_padded,), jnp.float32))
    dk, dv, dtab = jax.lax.fori_loop(_query_blocks_start(spec, j), q_ref.shape[0] // bq, body,
                                     init)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
    if dtab_ref:
        dtab_ref[0][...] = dtab


def _dq_kernel(table_ref, runs_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, qseg_ref,
               kseg_ref, dq_ref, *, spec: GpuSpec):
    i, head = pl.program_id(0), pl.program_id(2)
    bk, q0 = spec.block_k, pl.program_id(0) * spec.block_q
    q, do, q_seg = q_ref[...], do_ref[...], qseg_ref[...]
    lse, di = lse_ref[...][:, None], di_ref[...][:, None]

    def body(j, dq):
        k0 = j * bk
        keys = pl.ds(k0, bk)
        k = k_ref[keys, :]
        s = _logits(spec, table_ref, runs_ref, head, q, k, q_seg, kseg_ref[keys], q0, k0)
        p = jnp.exp(s - lse)
        dp = jax.lax.dot_general(do, v_ref[keys, :], _NT, preferred_element_type=jnp.float32)
        ds = p * (dp - di)
        return dq + jax.lax.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    end = _key_blocks_end(spec, i, k_ref.shape[0] // bk)
    dq = jax.lax.fori_loop(0, end, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


# ----------------------------------------------------------------------------- calls
# Grid: (outer block, batch, head). The outer block is a query block for the forward and dq
# passes, a key block for dk / dv; the other sequence is the program's whole row, which it
# walks block by block.


def _specs(outer: int, t: int, s: int, d: int, q_outer: bool):
    """Block specs of (q-side rows, k-side rows, q-side statistics, q segments, k segments):
    the outer side one block, the other its whole length."""
    tq, tk = (outer, s) if q_outer else (t, outer)
    rows_q = pl.BlockSpec((None, tq, None, d), lambda o, b, h: (b, o if q_outer else 0, h, 0))
    rows_k = pl.BlockSpec((None, tk, None, d), lambda o, b, h: (b, 0 if q_outer else o, h, 0))
    stat = pl.BlockSpec((None, None, tq), lambda o, b, h: (b, h, o if q_outer else 0))
    q_seg = pl.BlockSpec((None, tq), lambda o, b, h: (b, o if q_outer else 0))
    k_seg = pl.BlockSpec((None, tk), lambda o, b, h: (b, 0 if q_outer else o))
    return rows_q, rows_k, stat, q_seg, k_seg


def _whole(x):
    """A BlockSpec giving every program the whole (small) array: the table, the runs."""
    return pl.BlockSpec(x.shape, lambda *_: (0,) * x.ndim)


def _call(kernel, spec, grid, in_specs, out_specs, out_shape, cost):
    """The pallas_call: Triton-compiled where the program is lowered for a GPU, interpreted
    elsewhere (CPU tests and runs)."""
    def call(interpret):
        return pl.pallas_call(
            functools.partial(kernel, spec=spec), out_shape=out_shape, grid=grid,
            in_specs=in_specs, out_specs=out_specs, interpret=interpret, cost_estimate=cost,
            name=f"flash_gpu{kernel.__name__}",  # a profile names the kernel by it
            compiler_params=plgpu.CompilerParams(num_warps=spec.num_warps,
                                                 num_stages=spec.num_stages))

    if spec.interpret:
        return call(True)
    return lambda *args: jax.lax.platform_dependent(*args, cuda=call(False), rocm=call(False),
                                                    default=call(True))


def forward(spec: GpuSpec, table, runs, q, k, v, q_seg, kv_seg, cost=None):
    """-> (out [B, T, H, K] in q's dtype, logsumexp [B, H, T] float32)."""
    b, t, h, d = q.shape
    rows_q, rows_k, stat, qs, ks = _specs(spec.block_q, t, k.shape[1], d, True)
    out_shape = (jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, t), jnp.float32))
    return _call(_fwd_kernel, spec, (t // spec.block_q, b, h),
                 [_whole(table), _whole(runs), rows_q, rows_k, rows_k, qs, ks],
                 [rows_q, stat], out_shape, cost)(table, runs, q, k, v, q_seg, kv_seg)


def backward_dkv(spec: GpuSpec, table, runs, q, k, v, do, lse, di, q_seg, kv_seg, cost=None):
    """-> (dk, dv [B, S, H, K], and for a relative bias the table's gradient per (batch, head,
    key block) as [B, H, S / block_k, N_pad])."""
    b, t, h, d = q.shape
    s = k.shape[1]
    rows_q, rows_k, stat, qs, ks = _specs(spec.block_k, t, s, d, False)
    out_specs = [rows_k, rows_k]
    out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    if spec.kind == "relative":
        n_pad = spec.buckets_padded
        out_specs.append(pl.BlockSpec((None, None, None, n_pad), lambda j, b, h: (b, h, j, 0)))
        out_shape.append(jax.ShapeDtypeStruct((b, h, s // spec.block_k, n_pad), jnp.float32))
    return _call(_dkv_kernel, spec, (s // spec.block_k, b, h),
                 [_whole(table), _whole(runs), rows_q, rows_k, rows_k, rows_q, stat, stat, qs,
                  ks], out_specs, out_shape, cost)(table, runs, q, k, v, do, lse, di, q_seg,
                                                   kv_seg)


def backward_dq(spec: GpuSpec, table, runs, q, k, v, do, lse, di, q_seg, kv_seg, cost=None):
    """-> dq [B, T, H, K]."""
    b, t, h, d = q.shape
    rows_q, rows_k, stat, qs, ks = _specs(spec.block_q, t, k.shape[1], d, True)
    return _call(_dq_kernel, spec, (t // spec.block_q, b, h),
                 [_whole(table), _whole(runs), rows_q, rows_k, rows_k, rows_q, stat, stat, qs,
                  ks], rows_q, jax.ShapeDtypeStruct(q.shape, q.dtype), cost)(
                      table, runs, q, k, v, do, lse, di, q_seg, kv_seg)
