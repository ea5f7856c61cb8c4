"""GPU attention kernels for ``model.attention_kernel``: "cudnn" (cuDNN's fused attention through
``jax.nn.dot_product_attention``), "flash_gpu" (the Pallas Triton kernel of
gpu_flash_kernels.py, T5's relative bias made inside it) and "auto" (per backend).

Like flash_attention.KernelBias, a Stack hands its layers an object with an ``attend(q, k, v)``
method in place of the [B, 1, T, S] mask bias, and layers.MultiHeadAttention calls it.
- cudnn: masks as cuDNN takes them fastest. Unpacked rows (no segment ids) are right-padded
  (seqio's converters pad at the end; a padding token id is 0), so padding is query /
  key-value sequence lengths; packed rows get a boolean [B, 1, T, S] mask; causal is cuDNN's
  own mask. T5's relative bias (or ALiBi) is one [1, H, T, S] array per stack (slot offsets,
  as the XLA path outside decoding), passed as ``bias``: cuDNN returns its gradient and
  autodiff carries it to the [H, N] table. bfloat16 / float16 compute only.
- flash_gpu: the TPU kernel's design on Triton: segment ids and the [H, N] table go in,
  nothing [T, S] reaches HBM, and its custom VJP returns dq, dk, dv and the table's gradient.
Neither has attention dropout, the prefix-LM mask or PEFT prefix keys: refused in one line.
Decoding with a KV cache and prompt tuning use the XLA attention (transformer.Stack), as
with "flash".

The registry entries (plan.ATTENTION_BACKENDS lists them): CUDNN_ATTENTION, FLASH_GPU_ATTENTION
(their context refuses, in one line, a model or backend the kernel cannot run) and
AUTO_ATTENTION, which stands for the kernel ``resolve`` picks when a Stack is traced (the
backend and train / eval mode are known only then); ``describe`` is the line a run logs
about that pick.
"""

from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from t5lite.errors import UserError
from t5lite.models import flash_attention, flash_bias
from t5lite.models import gpu_flash_kernels as G
from t5lite.models import layers as L
from t5lite.models.positions import alibi_bias
from t5lite.models.registry import AttentionBackend, kernel_attend
from t5lite.models.transformer import LayerContext

# jax.nn.dot_product_attention's implementation for "cudnn". CPU tests set "xla" to run the
# same wrapper (masks, lengths, bias and its gradient) where cuDNN is absent.
CUDNN_IMPLEMENTATION = "cudnn"
# Off a GPU flash_gpu's Triton kernels would run in Pallas interpret mode (exact, far too
# slow for a run): refused unless a test sets this.
INTERPRET_OFF_GPU = False
GPU_BLOCK = 64  # flash_gpu's query and key blocks (tests shrink them)
# "auto": per backend, the kernels to try, fastest first (DESIGN.md's H200 probe: cuDNN); where
# none covers the model, and on every other backend, "xla". TPU too, as before "auto": "flash"
# stays a choice made by name, since `t5lite compile` traces a TPU slice's step on a CPU host
# (where "auto" is "xla") and a run must be the program its compile measured.
AUTO_ORDER = {"gpu": ("cudnn", "flash_gpu")}


# ----------------------------------------------------------------------------- choosing


def default_backend() -> str:
    """The backend the model is traced for now (the one place that reads it; tests simulate
    a GPU by replacing it)."""
    return jax.default_backend()


def covers(cfg, kernel: str, deterministic: bool = True, backend: Optional[str] = None):
    """Why ``kernel`` cannot run this model (cfg: a ModelConfig) here, or None."""
    backend = backend or default_backend()
    if cfg.attention_type != "multihead" or cfg.block_type != "transformer":
        return "its token mixer reads the masks as arrays"
    if cfg.funnel_blocks:  # funnel.pool_context pools the mask array between layers
        return "its Funnel encoder pools the attention mask as an array"
    if cfg.architecture == "prefix_lm":
        return "it has no prefix-LM mask"
    if cfg.peft.prefix_tokens:
        return "it has no PEFT prefix keys"
    if not deterministic and cfg.dropout_rate > 0:
        return "it has no attention dropout: set model.dropout_rate=0"
    if kernel == "cudnn":
        return _cudnn_lacks(cfg, backend)
    if kernel == "flash_gpu":
        return _flash_gpu_lacks(cfg, backend)
    return None


def _cudnn_lacks(cfg, backend: str):
    if CUDNN_IMPLEMENTATION == "cudnn" and backend != "gpu":
        return f"cuDNN needs a CUDA GPU (this process's backend is {backend})"
    if CUDNN_IMPLEMENTATION == "cudnn" and \
            jnp.dtype(cfg.dtype) not in (jnp.bfloat16, jnp.float16):
        return "cuDNN attention computes in bfloat16 / float16: set model.dtype=bfloat16"
    if cfg.head_dim % 8 or cfg.head_dim > 128:
        return f"cuDNN needs head_dim a multiple of 8 up to 128 (it is {cfg.head_dim})"
    return None


def _flash_gpu_lacks(cfg, backend: str):
    if backend != "gpu" and not INTERPRET_OFF_GPU:
        return (f"its Triton kernels need a GPU (this process's backend is {backend}; "
                "elsewhere they would only be interpreted)")
    if cfg.head_dim < 16 or cfg.head_dim & (cfg.head_dim - 1):
        return f"Triton needs head_dim a power of two, at least 16 (it is {cfg.head_dim})"
    return None


def resolve(cfg, deterministic: bool = True, backend: Optional[str] = None) -> str:
    """The kernel a Stack uses (outside decoding and prompt tuning). "auto": the first kernel
    of AUTO_ORDER[backend] that covers the model, else "xla". A named kernel that cannot cover
    the model here is refused in one line."""
    kernel = cfg.attention_kernel
    backend = backend or default_backend()
    if kernel == "auto":
        return next((k for k in AUTO_ORDER.get(backend, ())
                     if covers(cfg, k, deterministic, backend) is None), "xla")
    if kernel != "xla":
        refuse_unless_covered(cfg, kernel, deterministic, backend)
    return kernel


def refuse_unless_covered(cfg, kernel: str, deterministic: bool = True,
                          backend: Optional[str] = None) -> None:
    """A UserError, one line saying what to do, where ``kernel`` cannot run the model here."""
    why = covers(cfg, kernel, deterministic, backend)
    if why is not None:
        raise UserError(f"model.attention_kernel={kernel!r} cannot run this model: {why}; "
                        "use model.attention_kernel='xla' (or 'auto').")


def describe(cfg, backend: Optional[str] = None) -> str:
    """The line a run logs about model.attention_kernel="auto" (cfg: a ModelConfig): what it
    picks in training and in evaluation and why each faster kernel was passed over; for
    "flash" off a TPU, that the TPU kernel runs interpreted there; "" for any other named
    kernel (it runs as named or is refused)."""
    backend = backend or default_backend()
    if cfg.attention_kernel == "flash" and backend != "tpu":
        return (f"model.attention_kernel=flash on {backend}: the TPU kernel runs in Pallas "
                "interpret mode here, far slower than xla (a correctness check, not a "
                "speed-up): use model.attention_kernel=xla or auto")
    if cfg.attention_kernel != "auto":
        return ""
    train, evaluate = resolve(cfg, False, backend), resolve(cfg, True, backend)
    order = AUTO_ORDER.get(backend, ())
    ahead = order[:order.index(evaluate)] if evaluate in order else order
    why = [f"not {k}: {covers(cfg, k, True, backend)}" for k in ahead]
    picks = evaluate
    if train != evaluate:  # only training's attention dropout differs between the modes
        picks = f"{train} in training, {evaluate} in evaluation"
        why.append(f"not {evaluate} in training: {covers(cfg, evaluate, False, backend)}")
    return (f"model.attention_kernel=auto on {backend}: {picks}"
            + (f" ({'; '.join(why)})" if why else "")
            + ("; decoding with a KV cache: xla" if evaluate != "xla" else ""))


def kernel_biases(stack, kernel: str, q_valid_BL, segments_BL, encoder_tokens_BS=None,
                  encoder_segments_BS=None, deterministic=True):
    """(self-attention bias object, cross-attention one or None) of a Stack for ``kernel``
    (flash | flash_gpu | cudnn): what LayerContext.bias / cross_bias hold."""
    attn, cross = flash_attention.kernel_biases(stack, q_valid_BL, segments_BL,
                                                encoder_tokens_BS, encoder_segments_BS,
                                                deterministic)
    if kernel == "flash":
        return attn, cross
    if kernel == "flash_gpu":
        return FlashGpuBias.of(attn), None if cross is None else FlashGpuBias.of(cross)
    return cudnn_biases(stack, attn, q_valid_BL, segments_BL, encoder_tokens_BS,
                        encoder_segments_BS)


def _kernel_context(kernel: str, stack, q_valid_BL, segments_BL, rope_BL, encoded_BSD,
                    encoder_tokens_BS, encoder_segments_BS, deterministic):
    """The LayerContext of a Stack's layers with ``kernel``'s bias objects (as
    flash_attention.flash_context), after refusing a model or backend it cannot run."""
    refuse_unless_covered(stack.cfg, kernel, deterministic)
    bias, cross_bias = kernel_biases(
        stack, kernel, q_valid_BL, segments_BL,
        None if encoded_BSD is None else encoder_tokens_BS, encoder_segments_BS, deterministic)
    return LayerContext(bias=bias, rope_pos=rope_BL, encoded=encoded_BSD, cross_bias=cross_bias,
                        valid=q_valid_BL, backend=ENTRIES[kernel])


def _choose(cfg, deterministic: bool) -> AttentionBackend:
    return ENTRIES[resolve(cfg, deterministic)]


# model.attention_kernel = "cudnn" | "flash_gpu" | "auto" (registered in models/plan.py): the
# layers' attention calls their bias objects' attend; "auto" is the entry resolve picks
CUDNN_ATTENTION = AttentionBackend("cudnn", kernel_attend,
                                   functools.partial(_kernel_context, "cudnn"))
FLASH_GPU_ATTENTION = AttentionBackend("flash_gpu", kernel_attend,
                                       functools.partial(_kernel_context, "flash_gpu"))
AUTO_ATTENTION = AttentionBackend("auto", None, choose=_choose)
ENTRIES = {"xla": L.XLA_ATTENTION, "flash": flash_attention.FLASH_ATTENTION,
           "cudnn": CUDNN_ATTENTION, "flash_gpu": FLASH_GPU_ATTENTION}


# ----------------------------------------------------------------------------- cudnn


@struct.dataclass
class CudnnBias:
    """One attention's masks for jax.nn.dot_product_attention."""

    bias_1HTS: Optional[jnp.ndarray] = None  # float32 position bias (relative / ALiBi)
    mask_B1TS: Optional[jnp.ndarray] = None  # bool, packed rows
    q_lengths_B: Optional[jnp.ndarray] = None  # int32, right-padded rows
    kv_lengths_B: Optional[jnp.ndarray] = None
    causal: bool = struct.field(pytree_node=False, default=False)
    implementation: str = struct.field(pytree_node=False, default="cudnn")

    def attend(self, q_BTHK, k_BSHK, v_BSHK):
        """softmax(q k^T + bias, masked) v per head -> [B, T, H, K] in v's dtype. No scale:
        the model's query arrives scaled."""
        dtype = q_BTHK.dtype
        bias = None if self.bias_1HTS is None else self.bias_1HTS.astype(dtype)
        out = jax.nn.dot_product_attention(
            q_BTHK, k_BSHK.astype(dtype), v_BSHK.astype(dtype), bias=bias, mask=self.mask_B1TS,
            scale=1.0, is_causal=self.causal, query_seq_lengths=self.q_lengths_B,
            key_value_seq_lengths=self.kv_lengths_B, implementation=self.implementation)
        return out.astype(v_BSHK.dtype)


def _lengths(valid_BL):
    return jnp.sum(valid_BL, axis=1, dtype=jnp.int32)


def cudnn_biases(stack, kb, q_valid_BL, segments_BL, encoder_tokens_BS, encoder_segments_BS):
    """CudnnBias objects from the flash path's KernelBias ``kb`` (which read the stack's
    relative table and checked what no kernel covers)."""
    cfg, t = stack.cfg, q_valid_BL.shape[1]
    slots = jnp.arange(t)[None]
    bias = None
    if kb.kind == "relative":
        owner = stack if stack.shared is None else stack.shared
        bias = owner.relpos_bias(slots, slots, kb.bidirectional)
    elif kb.kind == "alibi":
        bias = alibi_bias(slots, slots, cfg.num_heads)
    fields = dict(implementation=CUDNN_IMPLEMENTATION)
    if segments_BL is not None:  # packed: the segment mask (causality stays cuDNN's)
        mask = L.self_attention_mask(q_valid_BL, segments_BL)[:, None]
        attn = CudnnBias(bias, mask, causal=kb.causal, **fields)
    elif stack.kind == "encoder":  # right-padded: lengths
        n = _lengths(q_valid_BL)
        attn = CudnnBias(bias, None, n, n, causal=kb.causal, **fields)
    else:  # an unpacked decoder row has no padding
        attn = CudnnBias(bias, causal=kb.causal, **fields)
    if encoder_tokens_BS is None:
        return attn, None
    k_valid_BS = encoder_tokens_BS != 0
    if segments_BL is not None and encoder_segments_BS is not None:
        mask = L.cross_attention_mask(q_valid_BL, k_valid_BS, segments_BL, encoder_segments_BS)
        return attn, CudnnBias(mask_B1TS=mask[:, None], **fields)
    return attn, CudnnBias(q_lengths_B=_lengths(q_valid_BL), kv_lengths_B=_lengths(k_valid_BS),
                           **fields)


# ----------------------------------------------------------------------------- flash_gpu


@struct.dataclass
class FlashGpuBias:
    """flash_attention.KernelBias's fields, attended by the Triton kernel."""

    q_segments_BT: jnp.ndarray  # int32 segment id per query slot, 0 = padding
    kv_segments_BS: jnp.ndarray
    table_HN: Optional[jnp.ndarray] = None
    kind: str = struct.field(pytree_node=False, default="none")  # none | relative | alibi
    causal: bool = struct.field(pytree_node=False, default=False)
    bidirectional: bool = struct.field(pytree_node=False, default=True)
    max_distance: int = struct.field(pytree_node=False, default=128)
    block_q: int = struct.field(pytree_node=False, default=GPU_BLOCK)
    block_k: int = struct.field(pytree_node=False, default=GPU_BLOCK)

    @classmethod
    def of(cls, kb):
        """The same attention as flash_attention.KernelBias ``kb``, GPU blocks."""
        return cls(kb.q_segments_BT, kb.kv_segments_BS, kb.table_HN, kb.kind, kb.causal,
                   kb.bidirectional, kb.max_distance, GPU_BLOCK, GPU_BLOCK)

    def attend(self, q_BTHK, k_BSHK, v_BSHK):
        return flash_gpu_attend(q_BTHK, k_BSHK, v_BSHK, self)


def _pow2_at_least(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(n - 1, 0).bit_length())


def _spec_and_table(fb: FlashGpuBias, num_heads: int, t: int, s: int):
    """The static GpuSpec (blocks: the configured ones, or a short sequence's power of two)
    and the kernel's table ([H * N] relative table, [H] ALiBi slopes or a placeholder) and
    runs (flash_bias.runs_array)."""
    blocks = dict(block_q=min(fb.block_q, _pow2_at_least(t)),
                  block_k=min(fb.block_k, _pow2_at_least(s)), causal=fb.causal, kind=fb.kind)
    none = jnp.zeros((1,), jnp.int32)
    if fb.kind == "relative":
        n = fb.table_HN.shape[1]
        runs = flash_bias.bucket_runs(n, fb.max_distance, fb.bidirectional)
        spec = G.GpuSpec(num_runs=len(runs), num_buckets=n, **blocks)
        table = fb.table_HN.astype(jnp.float32).reshape(-1)
        return spec, table, jnp.asarray(flash_bias.runs_array(runs))
    if fb.kind == "alibi":
        return G.GpuSpec(**blocks), jnp.asarray(flash_bias.alibi_slopes(num_heads)), none
    return G.GpuSpec(**blocks), jnp.zeros((num_heads,), jnp.float32), none


def flash_gpu_attend(q_BTHK, k_BSHK, v_BSHK, fb: FlashGpuBias):
    """The Triton kernel on the model's layout (padded to whole blocks); under a mesh, one
    kernel per (batch, heads) shard, as flash_attention.attend."""
    b, t, h, d = q_BTHK.shape
    s = k_BSHK.shape[1]
    spec, table, runs = _spec_and_table(fb, h, t, s)
    t_pad = -(-t // spec.block_q) * spec.block_q
    s_pad = -(-s // spec.block_k) * spec.block_k

    def local(table, runs, q, k, v, q_seg, kv_seg):
        pad = lambda x, n: jnp.pad(x, [(0, 0), (0, n)] + [(0, 0)] * (x.ndim - 2))  # noqa
        out = _attend(spec, table, runs, pad(q, t_pad - t), pad(k, s_pad - s).astype(q.dtype),
                      pad(v, s_pad - s).astype(q.dtype), pad(q_seg, t_pad - t),
                      pad(kv_seg, s_pad - s))
        return out[:, :t].astype(v_BSHK.dtype)

    args = (table, runs, q_BTHK, k_BSHK, v_BSHK, fb.q_segments_BT, fb.kv_segments_BS)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return local(*args)
    batch, heads = nn.logical_to_mesh_axes(("batch", "heads"))
    x_spec, seg_spec = P(batch, None, heads, None), P(batch, None)
    # The flattened [H * N] table is split by heads like q only when it is per head: the
    # kernel indexes it by the shard's own head ids. (check_vma off: pallas_call's outputs
    # carry no varying-axes annotation.)
    table_spec = P(heads) if fb.kind in ("relative", "alibi") else P()
    in_specs = (table_spec, P(), x_spec, x_spec, x_spec, seg_spec, seg_spec)
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=x_spec,
                         check_vma=False)(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(spec, table, runs, q, k, v, q_seg, kv_seg):
    return G.forward(spec, table, runs, q, k, v, q_seg, kv_seg)[0]


def _attend_fwd(spec, table, runs, q, k, v, q_seg, kv_seg):
    out, lse = G.forward(spec, table, runs, q, k, v, q_seg, kv_seg)
    return out, (table, runs, q, k, v, q_seg, kv_seg, out, lse)


def _attend_bwd(spec, residuals, do):
    table, runs, q, k, v, q_seg, kv_seg, out, lse = residuals
    do = do.astype(q.dtype)
    di = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, T, H]
    operands = (table, runs, q, k, v, do, lse, jnp.swapaxes(di, 1, 2), q_seg, kv_seg)
    dk, dv, *dtab = G.backward_dkv(spec, *operands)
    dq = G.backward_dq(spec, *operands)
    dtable = jnp.zeros_like(table)
    if dtab:  # [B, H, key blocks, N_pad] -> [H * N]
        dtable = jnp.sum(dtab[0][..., :spec.num_buckets], axis=(0, 2)).reshape(-1)
    return dtable, None, dq, dk, dv, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)
