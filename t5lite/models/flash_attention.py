"""Flash attention with T5's relative position bias (or ALiBi) made inside a Pallas TPU kernel:
``model.attention_kernel="flash"``.

The XLA path (layers.MultiHeadAttention) adds a [B, H, T, S] bias (mask + positions) to
[B, H, T, S] logits: quadratic memory that rules out long inputs. Here a Stack hands its layers
a ``KernelBias`` instead: per-token segment ids (0 = padding) and the [heads, buckets] table;
the kernel (flash_kernels.py) builds each tile's bias and mask from the tile's offsets, and
the custom VJP's backward accumulates the table's gradient per bucket (flash_bias.py). Nothing
quadratic reaches HBM. Positions are slots, as in the XLA path outside decoding: in a packed
row a slot offset equals the position offset within a segment.

Rows with no visible key (padding queries) hold unspecified values, as their XLA counterparts
do (a uniform average there); nothing reads them. Off TPU the kernels run in Pallas interpret
mode (slow, exact), so a CPU run or test gives the numbers a TPU would.
"""

from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from t5lite.errors import UserError
from t5lite.models import flash_bias, flash_kernels as K
from t5lite.models.registry import AttentionBackend, kernel_attend
from t5lite.models.transformer import LayerContext

DEFAULT_BLOCK = 512


@struct.dataclass
class KernelBias:
    """What a layer's attention gets in place of the [B, H, T, S] bias when the flash kernel
    is on; ``attend`` runs the kernel (FLASH_ATTENTION's attend step calls it)."""

    q_segments_BT: jnp.ndarray  # int32 segment id per query slot, 0 = padding
    kv_segments_BS: jnp.ndarray  # per key slot
    table_HN: Optional[jnp.ndarray] = None  # relative: the [heads, buckets] bias table
    kind: str = struct.field(pytree_node=False, default="none")  # none | relative | alibi
    causal: bool = struct.field(pytree_node=False, default=False)
    bidirectional: bool = struct.field(pytree_node=False, default=True)  # relative buckets
    max_distance: int = struct.field(pytree_node=False, default=128)
    block_q: int = struct.field(pytree_node=False, default=DEFAULT_BLOCK)
    block_k: int = struct.field(pytree_node=False, default=DEFAULT_BLOCK)

    def attend(self, q_BTHK, k_BSHK, v_BSHK):
        """softmax(q k^T + bias) v per head -> [B, T, H, K] in v's dtype."""
        return attend(q_BTHK, k_BSHK, v_BSHK, self)


def segments(valid_BL, segments_BL=None):
    """The kernel's segment ids: the given ones (or 1) where valid, 0 at padding."""
    seg = jnp.ones(valid_BL.shape, jnp.int32) if segments_BL is None else segments_BL
    return jnp.where(valid_BL, seg.astype(jnp.int32), 0)


def kernel_biases(stack, q_valid_BL, segments_BL, encoder_tokens_BS=None,
                  encoder_segments_BS=None, deterministic=True):
    """(self-attention KernelBias, cross-attention KernelBias or None) of a Stack (outside
    decoding): the same masks as layers.self_attention_mask / cross_attention_mask, and the
    stack's relative bias table (read from its RelativePositionBias) or ALiBi."""
    cfg = stack.cfg
    if cfg.architecture == "prefix_lm" or cfg.peft.prefix_tokens:
        raise UserError("model.attention_kernel='flash' has no prefix-LM mask and no PEFT "
                        "prefix keys; use model.attention_kernel='xla' for this model.")
    if not deterministic and cfg.dropout_rate > 0:
        raise UserError("model.attention_kernel='flash' has no attention dropout: set "
                        "model.dropout_rate=0 (T5 v1.1 pretrains without) or use 'xla'.")
    kind = cfg.position if cfg.position in ("relative", "alibi") else "none"
    table_HN = None
    if kind == "relative":
        owner = stack if stack.shared is None else stack.shared
        table_HN = owner.relpos_bias(None, None)
    seg_BL = segments(q_valid_BL, segments_BL)
    blocks = dict(block_q=DEFAULT_BLOCK, block_k=DEFAULT_BLOCK)  # (read now: tests shrink it)
    attn = KernelBias(seg_BL, seg_BL, table_HN, kind, causal=stack.kind == "decoder",
                      bidirectional=stack.kind == "encoder",
                      max_distance=cfg.relative_max_distance, **blocks)
    if encoder_tokens_BS is None:
        return attn, None
    both = segments_BL is not None and encoder_segments_BS is not None
    k_valid_BS = encoder_tokens_BS != 0
    cross = KernelBias(segments(q_valid_BL, segments_BL if both else None),
                       segments(k_valid_BS, encoder_segments_BS if both else None), **blocks)
    return attn, cross


def flash_context(stack, q_valid_BL, segments_BL, rope_BL, encoded_BSD, encoder_tokens_BS,
                  encoder_segments_BS, deterministic):
    """The LayerContext of a Stack's layers with the flash kernel: KernelBias objects (segment
    ids, this stack's relative bias table) in place of masks and position biases."""
    bias, cross_bias = kernel_biases(
        stack, q_valid_BL, segments_BL, None if encoded_BSD is None else encoder_tokens_BS,
        encoder_segments_BS, deterministic)
    return LayerContext(bias=bias, rope_pos=rope_BL, encoded=encoded_BSD, cross_bias=cross_bias,
                        valid=q_valid_BL, backend=FLASH_ATTENTION)


# model.attention_kernel="flash" (registered in models/plan.py): the layers' attention calls
# their KernelBias's attend
FLASH_ATTENTION = AttentionBackend("flash", kernel_attend, flash_context)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _blocks(kb: KernelBias, t: int, s: int) -> tuple:
    """(block_q, block_k): the configured ones, or a short sequence rounded up to 128 (TPU
    wants block_k a multiple of the 128 lanes, block_q of the 8 sublanes)."""
    bq = min(kb.block_q, _round_up(t, K.SUBLANES * 16))
    bk = min(kb.block_k, _round_up(s, K.LANES))
    return bq, bk


def _spec_and_table(kb: KernelBias, num_heads: int, bq: int, bk: int):
    """The kernel's static spec and its SMEM operands: a per-head table ([H, N] relative
    table, [H, 1] ALiBi slopes, or a placeholder) and the bucket runs (runs_array)."""
    base = dict(kind=kb.kind, causal=kb.causal, block_q=bq, block_k=bk)
    if kb.kind == "relative":
        n = kb.table_HN.shape[1]
        runs = flash_bias.bucket_runs(n, kb.max_distance, kb.bidirectional)
        spec = K.KernelSpec(num_runs=len(runs), num_buckets=n, **base)
        return spec, kb.table_HN.astype(jnp.float32), jnp.asarray(flash_bias.runs_array(runs))
    none = jnp.zeros((1,), jnp.int32)
    if kb.kind == "alibi":
        return K.KernelSpec(**base), jnp.asarray(flash_bias.alibi_slopes(num_heads))[:, None], none
    return K.KernelSpec(**base), jnp.zeros((num_heads, 1), jnp.float32), none


def attend(q_BTHK, k_BSHK, v_BSHK, kb: KernelBias):
    """The kernel on the model's layout; under a mesh, one kernel per (batch, heads) shard."""
    b, t, h, d = q_BTHK.shape
    s = k_BSHK.shape[1]
    bq, bk = _blocks(kb, t, s)
    spec, table, runs = _spec_and_table(kb, h, bq, bk)
    t_pad, s_pad = _round_up(t, bq), _round_up(s, bk)

    def local(table, runs, q, k, v, q_seg, kv_seg):
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [B, H, L, K]
        q = jnp.pad(q, ((0, 0), (0, 0), (0, t_pad - t), (0, 0)))
        k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, s_pad - s), (0, 0))) for x in (k, v))
        q_seg = jnp.pad(q_seg, ((0, 0), (0, t_pad - t)))
        kv_seg = jnp.pad(kv_seg, ((0, 0), (0, s_pad - s)))
        out = _attend(spec, table.reshape(-1), runs, q, k.astype(q.dtype), v.astype(q.dtype),
                      jnp.broadcast_to(q_seg[:, :, None], q_seg.shape + (K.LANES,)),
                      jnp.broadcast_to(kv_seg[:, None, :], (kv_seg.shape[0], K.SUBLANES,
                                                            s_pad)))
        return jnp.swapaxes(out[:, :, :t], 1, 2).astype(v_BSHK.dtype)

    args = (table, runs, q_BTHK, k_BSHK, v_BSHK, kb.q_segments_BT, kb.kv_segments_BS)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return local(*args)
    batch, heads = nn.logical_to_mesh_axes(("batch", "heads"))
    x_spec, seg_spec = P(batch, None, heads, None), P(batch, None)
    # check_vma off: pallas_call's outputs carry no varying-axes annotation. The table is
    # split by heads like q (the kernel indexes it by the shard's own head ids); its gradient
    # is summed over the batch shards by shard_map's transpose.
    in_specs = (P(heads), P(), x_spec, x_spec, x_spec, seg_spec, seg_spec)
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=x_spec,
                         check_vma=False)(*args)


# ----------------------------------------------------------------------------- custom VJP


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(spec, table, runs, q, k, v, q_seg, kv_seg):
    return K.forward(spec, table, runs, q, k, v, q_seg, kv_seg, forward_cost(spec, q, k))[0]


def _attend_fwd(spec, table, runs, q, k, v, q_seg, kv_seg):
    out, lse = K.forward(spec, table, runs, q, k, v, q_seg, kv_seg, forward_cost(spec, q, k))
    return out, (table, runs, q, k, v, q_seg, kv_seg, out, lse[..., 0])


def _attend_bwd(spec, residuals, do):
    table, runs, q, k, v, q_seg, kv_seg, out, lse = residuals
    do = do.astype(q.dtype)
    di = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    lse, di = (jnp.broadcast_to(x[..., None], x.shape + (K.LANES,)) for x in (lse, di))
    operands = (table, runs, q, k, v, do, lse, di, q_seg, kv_seg)
    dk, dv, *dtab = K.backward_dkv(spec, *operands, cost=backward_cost(spec, q, k, "dkv"))
    dq = K.backward_dq(spec, *operands, cost=backward_cost(spec, q, k, "dq"))
    dtable = jnp.zeros_like(table)
    if dtab:  # [B, H, N_pad, 128] lane-replicated rows -> [H * N]
        dtable = jnp.sum(dtab[0][:, :, :spec.num_buckets, 0], axis=0).reshape(-1)
    return dtable, None, dq, dk, dv, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


# ----------------------------------------------------------------------------- costs


def visited_tiles(spec, t: int, s: int) -> int:
    """How many (query block, key block) tiles one (batch, head) runs."""
    nq, nk = t // spec.block_q, s // spec.block_k
    if not spec.causal:
        return nq * nk
    return sum(min(nk - 1, ((i + 1) * spec.block_q - 1) // spec.block_k) + 1 for i in range(nq))


def _cost(spec, q, k, matmuls: int, tile_bytes: int, once_bytes: int):
    """pl.CostEstimate of a kernel doing ``matmuls`` [bq, bk, K] matmuls and moving
    ``tile_bytes`` per visited tile and ``once_bytes`` per (batch, head)."""
    b, h, t, d = q.shape
    tiles = visited_tiles(spec, t, k.shape[2])
    return pl.CostEstimate(
        flops=int(2 * matmuls * b * h * tiles * spec.block_q * spec.block_k * d),
        transcendentals=int(b * h * tiles * spec.block_q * spec.block_k),
        bytes_accessed=int(b * h * (tiles * tile_bytes + once_bytes)))


def forward_cost(spec, q, k):
    """FLOPs (q k^T and p v on the visited tiles), exps and HBM bytes of the forward kernel:
    each visited tile reads a key and a value block; q, out and the statistics move once.
    XLA's cost analysis cannot see inside the kernel: `t5lite compile` reads this estimate
    from the compiled custom call (tpu/hlo_cost.py)."""
    t, d, item = q.shape[2], q.shape[3], q.dtype.itemsize
    return _cost(spec, q, k, 2, 2 * spec.block_k * d * item,
                 t * (2 * d * item + K.LANES * 4))


def backward_cost(spec, q, k, which: str):
    """The same for a backward kernel. dk / dv: 4 matmuls a tile (s, dv, dp, dk), reading q,
    do and two lane-replicated statistics per tile, k, v, dk, dv once. dq: 3 (s, dp, dq),
    reading k and v per tile, q, do, dq and the statistics once."""
    t, s, d, item = q.shape[2], k.shape[2], q.shape[3], q.dtype.itemsize
    stats = 2 * K.LANES * 4
    if which == "dkv":
        return _cost(spec, q, k, 4, spec.block_q * (2 * d * item + stats), 4 * s * d * item)
    return _cost(spec, q, k, 3, 2 * spec.block_k * d * item, t * (3 * d * item + stats))
