"""The PEFT methods as model modules: LoRA, (IA)^3, prefix tuning, adapters, prompt tuning.

They reach the model from outside: ``stack_modules(mcfg)`` gives build_model the Stack's
modules (transformer.StackModules): subclasses of the core attention / MLP that build the
same projections under the same names (``LoraDense`` where LoRA targets them), the adapter
after each MLP sub-layer and the soft prompt. The core layers never import this package.
Why subclasses rather than swapping modules after the model is built (levanter's
``loraize``): a Flax linen module builds its children inside its own ``__call__``, so a swap
from outside would have to create params in another module's scope, inside nn.scan /
nn.remat; a subclass gets the same scopes, names and remat tags.

The params live inside the modules they adapt, so they scan with the layers (a leading
[num_layers] axis when scan_layers=True), and the base params keep their T5X names:

    .../{query,key,value,out,wi,wo,...}/lora_a   [in..., r]    (LoRA A, fan-in init)
    .../{query,key,value,out,wi,wo,...}/lora_b   [r, out...]   (LoRA B, zeros: step 0 = base)
    .../{attention,self_attention,encoder_decoder_attention}/ia3_key, ia3_value  [H, K] (ones)
    .../mlp/ia3_mlp                              [F] (ones)
    .../layers/mlp_adapter/{layer_norm,wi,wo}/...  (after the MLP; wo = 0)
    .../{attention,self_attention}/prefix_key, prefix_value  [N, H, K]
    encoder/prompt (decoder/prompt for decoder-only models)  [N, D]

(LoRA factors: [fan_in, r] and [r, fan_out] with model.flat_kernels.)
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import t5lite.models.layers as L
from t5lite import models
from t5lite.models.transformer import CORE_MODULES, StackModules
from t5lite.peft.methods import ADAPTER_SUFFIX, PROMPT_NAME, enabled


class LoraDense(L.DenseGeneral):
    """DenseGeneral plus LoRA's low-rank update (alpha / r) (x A) B (Hu et al., 2021): params
    ``lora_a`` [in..., r] (fan-in init) and ``lora_b`` [r, out...] (zeros, so the layer starts
    as the plain one) beside the kernel, stored as the kernel is (DenseGeneral.stored_layout)."""

    lora_rank: int = 0
    lora_alpha: float = 0.0

    def output_update(self, x, in_shape, features):
        rank = self.lora_rank
        (in_dims, in_axes), (out_dims, out_axes) = self.stored_layout(in_shape, features)

        def a_init(key, shape, dtype=jnp.float32):
            flat = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")(
                key, (int(np.prod(in_shape)), rank), dtype)
            return flat.reshape(shape)

        a = self.param("lora_a", nn.with_logical_partitioning(a_init, in_axes + (None,)),
                       in_dims + (rank,), jnp.float32).reshape(in_shape + (rank,))
        b = self.param("lora_b", nn.with_logical_partitioning(
            nn.initializers.zeros, (None,) + out_axes), (rank,) + out_dims,
            jnp.float32).reshape((rank,) + features)
        contract = tuple(range(x.ndim - self.n_in, x.ndim))
        h = jax.lax.dot_general(x, a.astype(self.dtype),
                                ((contract, tuple(range(self.n_in))), ((), ())))
        y = jnp.tensordot(h, b.astype(self.dtype), axes=1)
        return y * jnp.asarray(self.lora_alpha / rank, self.dtype)


def lora_dense(mcfg, name: str, **fields) -> L.DenseGeneral:
    """The dense layer ``name``: a LoraDense when LoRA targets it, else the plain one."""
    p = mcfg.peft
    if p.lora_rank and any(fnmatch.fnmatchcase(name, t) for t in p.lora_targets):
        return LoraDense(name=name, lora_rank=p.lora_rank, lora_alpha=p.lora_alpha, **fields)
    return L.DenseGeneral(name=name, **fields)


def ia3_scale(module: nn.Module, name: str, x, axes):
    """(IA)^3: x times a learned vector over its trailing len(axes) dims, initialised to ones
    (Liu et al., 2022), so the model starts as the base model."""
    shape = x.shape[-len(axes):]
    scale = module.param(name, nn.with_logical_partitioning(nn.initializers.ones, axes),
                         shape, jnp.float32)
    return x * scale.astype(x.dtype)


def add_prefix(module: nn.Module, mcfg, k_BSHK, v_BSHK, bias_BHTS):
    """Prefix tuning (Li & Liang, 2021): N learned keys / values prepended to this layer's
    self-attention keys / values; every query sees them (bias 0, no position)."""
    n, b = mcfg.peft.prefix_tokens, k_BSHK.shape[0]
    shape = (n, mcfg.num_heads, mcfg.head_dim)
    axes = (None, "heads", "kv")
    init = nn.initializers.normal(0.02 if mcfg.init_std <= 0 else mcfg.init_std)
    key_NHK = module.param("prefix_key", nn.with_logical_partitioning(init, axes), shape,
                           jnp.float32)
    value_NHK = module.param("prefix_value", nn.with_logical_partitioning(init, axes), shape,
                             jnp.float32)
    key_BNHK = jnp.broadcast_to(key_NHK.astype(k_BSHK.dtype), (b,) + shape)
    value_BNHK = jnp.broadcast_to(value_NHK.astype(v_BSHK.dtype), (b,) + shape)
    pad = [(0, 0)] * (bias_BHTS.ndim - 1) + [(n, 0)]
    return (jnp.concatenate([key_BNHK, k_BSHK], axis=1),
            jnp.concatenate([value_BNHK, v_BSHK], axis=1), jnp.pad(bias_BHTS, pad))


class Attention(L.MultiHeadAttention):
    """MultiHeadAttention with LoRA on its target projections, (IA)^3 on keys / values and
    (self-attention only) a prefix-tuning prefix."""

    def dense_layer(self, name: str, **fields) -> L.DenseGeneral:
        return lora_dense(self.cfg, name, **fields)

    def adapt_kv(self, k_BSHK, v_BSHK):
        if not self.cfg.peft.ia3:
            return k_BSHK, v_BSHK
        return (ia3_scale(self, "ia3_key", k_BSHK, ("heads", "kv")),
                ia3_scale(self, "ia3_value", v_BSHK, ("heads", "kv")))

    def extend_kv(self, k_BSHK, v_BSHK, bias_BHTS):
        if not self.cfg.peft.prefix_tokens or self.cross:
            return k_BSHK, v_BSHK, bias_BHTS
        return add_prefix(self, self.cfg, k_BSHK, v_BSHK, bias_BHTS)


class MLP(L.MLP):
    """MLP with LoRA on its target projections and (IA)^3 on the hidden activations."""

    def dense_layer(self, name: str, **fields) -> L.DenseGeneral:
        return lora_dense(self.cfg, name, **fields)

    def adapt_hidden(self, h_BLF):
        return ia3_scale(self, "ia3_mlp", h_BLF, ("mlp",)) if self.cfg.peft.ia3 else h_BLF


class Adapter(nn.Module):
    """The T5 paper's adapter layer (Section 3.5.1, Table 10): x + wo(relu(wi(norm(x)))), a
    dense-ReLU-dense block (no biases, as T5's dense layers) with its own layer norm and
    residual, after each feed-forward sub-layer; ``wo`` starts at zero, so the adapter is the
    identity at init."""

    cfg: Any

    @nn.compact
    def __call__(self, x_BLD, deterministic=True):
        cfg = self.cfg
        h = L.make_norm(cfg, "layer_norm")(x_BLD)
        h = L.make_dense(cfg, cfg.peft.adapter_dim, ("embed", None), False, name="wi",
                         init=nn.initializers.variance_scaling(1.0, "fan_in",
                                                               "truncated_normal"))(h)
        y = L.make_dense(cfg, cfg.d_model, (None, "embed"), False, name="wo",
                         init=nn.initializers.zeros)(nn.relu(h))
        return x_BLD + nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)


def prompted_stack(mcfg) -> str:
    """Which stack receives the soft prompt: the encoder, or the decoder of decoder-only models
    ("" when prompt tuning is off)."""
    if not mcfg.peft.prompt_tokens:
        return ""
    return "encoder" if mcfg.architecture in ("encoder_decoder", "encoder_only") else "decoder"


def prompt_param(module: nn.Module, mcfg):
    """The soft prompt [N, D] (Lester et al., 2021), initialised like the token embeddings."""
    return module.param(PROMPT_NAME, nn.with_logical_partitioning(
        L.embed_init(mcfg), (None, "embed")), (mcfg.peft.prompt_tokens, mcfg.d_model),
        jnp.float32)


def prepend_prompt(prompt_ND, x_BLD, mask_BLS, q_valid_BL, positions_BL):
    """Prepend the prompt to the embedded tokens and extend mask and positions.

    Real tokens see the prompt and their own segment as before; prompt tokens see only the
    prompt (so packed examples cannot leak into each other through it). Prompt tokens carry
    position 0 and no position embedding; real tokens keep their positions.
    """
    b, n = x_BLD.shape[0], prompt_ND.shape[0]
    p_BND = jnp.broadcast_to(prompt_ND.astype(x_BLD.dtype), (b,) + prompt_ND.shape)
    x_BLD = jnp.concatenate([p_BND, x_BLD], axis=1)
    l = mask_BLS.shape[1]
    top = jnp.concatenate([jnp.ones((b, n, n), bool), jnp.zeros((b, n, l), bool)], axis=2)
    bottom = jnp.concatenate([jnp.broadcast_to(q_valid_BL[:, :, None], (b, l, n)), mask_BLS],
                             axis=2)
    mask_BLS = jnp.concatenate([top, bottom], axis=1)
    positions_BL = jnp.concatenate([jnp.zeros((b, n), positions_BL.dtype), positions_BL], axis=1)
    return x_BLD, mask_BLS, positions_BL


@dataclasses.dataclass(frozen=True)
class SoftPrompt:
    """Prompt tuning as a Stack's soft prompt (transformer.StackModules.prompt)."""

    tokens: int  # N
    stack: str  # the kind of stack that receives it (prompted_stack)

    def create(self, module: nn.Module, mcfg):
        return prompt_param(module, mcfg)

    def prepend(self, prompt_ND, x_BLD, mask_BLS, q_valid_BL, positions_BL):
        return prepend_prompt(prompt_ND, x_BLD, mask_BLS, q_valid_BL, positions_BL)


def stack_modules(mcfg) -> StackModules:
    """The Stack's modules for ``mcfg.peft``: the core layers when PEFT is off, else their
    PEFT subclasses (same names, added params), the adapter and the soft prompt. ``mcfg``: a
    ModelConfig or a full Config."""
    mcfg = getattr(mcfg, "model", mcfg)
    if not enabled(mcfg):
        return CORE_MODULES
    p = mcfg.peft
    return StackModules(
        attention=Attention, mlp=MLP, after_mlp=Adapter if p.adapter_dim else None,
        after_mlp_name="mlp" + ADAPTER_SUFFIX if p.adapter_dim else "",
        prompt=SoftPrompt(p.prompt_tokens, prompted_stack(mcfg)) if p.prompt_tokens else None)


def build_model(cfg):
    """The model of ``cfg`` (a ModelConfig or a full Config) with its PEFT modules: the core
    architecture built from ``stack_modules`` (the plain model when PEFT is off)."""
    return models.build_model(cfg, stack_modules(cfg))
