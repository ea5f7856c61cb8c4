"""One Transformer Block, and the Stack (embeddings, masks, layers, final norm) built from it.

A Stack is an encoder (bidirectional) or a decoder (causal, optional prefix-LM and cross-
attention). Masks and position biases are built once per stack and shared by all layers as
additive biases (T5 shares its relative bias across layers). Layers are scanned (params stacked
on a leading "layers" axis, named ``layers``) or unrolled (``layers_0``, ``layers_1``, ...), and
optionally rematerialised; both give identical numerics.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.errors import UserError
from t5lite.models import funnel, layer_plan, moe
from t5lite.models import flash_attention
from t5lite.models import layers as L
from t5lite.models import residual, sharing
from t5lite.models import token_mixing
from t5lite.models.evolved import EvolvedBlock
from t5lite.models.gradient_rules import add_position_bias
from t5lite.models.positions import RelativePositionBias, alibi_bias, sinusoidal
from t5lite.models.transparent import TransparentMemory

# Names tagged with jax.ad_checkpoint.checkpoint_name on the projection outputs (layers.py).
PROJECTION_NAMES = ("query_proj", "key_proj", "value_proj", "out_proj", "mlpwi", "mlpwi_0",
                    "mlpwi_1", "mlpwo")
REMAT_POLICIES = {
    # minimal: keep the named projection outputs (attention q/k/v/out, MLP wi/wo) and recompute
    # the cheap rest (norms, softmax, activations). A policy by name, not by "dot", so it holds
    # whatever form the matmul takes (a custom VJP hides dots from dot-based policies).
    "minimal": jax.checkpoint_policies.save_only_these_names(*PROJECTION_NAMES),
    "full": jax.checkpoint_policies.nothing_saveable,  # recompute the whole block
}


class StackModules(NamedTuple):
    """What a Stack builds besides its config's core layers: the sub-layer classes of its
    Blocks, an optional module after each MLP sub-layer and an optional soft prompt. The
    defaults are the core model; t5lite.peft supplies subclasses (same module names, added
    params) and the extra modules, which build_model passes in."""

    attention: type = L.MultiHeadAttention
    mlp: type = L.MLP
    after_mlp: Optional[type] = None  # built as after_mlp(cfg, name=after_mlp_name)
    after_mlp_name: str = ""
    # soft prompt: .stack (the kind of stack it goes into), .tokens (its length N),
    # .create(stack_module, cfg) -> [N, D] param, .prepend(prompt_ND, x_BLD, mask_BLS,
    # valid_BL, positions_BL) -> (x_BLD, mask_BLS, positions_BL) with N more positions
    prompt: Optional[Any] = None


CORE_MODULES = StackModules()


@flax.struct.dataclass
class LayerContext:
    """The arrays a Stack builds once and shares with all its Blocks."""

    bias: Any  # self-attention mask as an additive bias [B, 1, T, S] (flash: a KernelBias)
    pos_bias: Optional[jnp.ndarray] = None  # relative / ALiBi position bias [1 or B, H, T, S]
    rope_pos: Optional[jnp.ndarray] = None  # RoPE positions [B, T]
    cache_index: Optional[jnp.ndarray] = None  # decoding: the KV cache write index []
    encoded: Optional[jnp.ndarray] = None  # encoder output for cross-attention [B, S, D]
    cross_bias: Optional[Any] = None  # cross-attention mask bias [B, 1, T, S] (or KernelBias)
    valid: Optional[jnp.ndarray] = None  # [B, T] real (non-padding) tokens: what MoE routes


class Block(nn.Module):
    """Self-attention, optional cross-attention, MLP; each a residual sub-layer, pre- or post-norm.

    Parameter names follow T5X: encoder blocks have ``attention`` / ``pre_attention_layer_norm``;
    decoder blocks ``self_attention``, ``encoder_decoder_attention`` with
    ``pre_self_attention_layer_norm`` / ``pre_cross_attention_layer_norm``; both ``mlp`` and
    ``pre_mlp_layer_norm``. Post-norm blocks name the norms ``post_*`` instead of ``pre_*``.
    ``ctx`` (a LayerContext) holds the arrays shared by all layers. The sub-layer classes come
    from ``modules`` (the core layers unless the builder passes others).
    """

    cfg: object
    decoder: bool = False
    cross: bool = False
    scanned: bool = False
    modules: StackModules = CORE_MODULES
    ffn_layer: str = "dense"  # this layer's FFN (layer_plan.ffn_layer_at)
    pool: int = 1  # Funnel: mean-pool the sequence by this after the self-attention

    @nn.compact
    def __call__(self, x_BLD, ctx: LayerContext, deterministic=True, decode=False):
        cfg = self.cfg
        modules = self.modules

        def sublayer(x, stem, fn):  # x + branch, pre- or post-norm, ReZero / Fixup scalars
            fn = sharing.gated(cfg, x, stem, fn)  # (the Universal Transformer's gating)
            return residual.sublayer(self, cfg, x, stem, fn, deterministic)

        stem = "self_attention" if self.decoder else "attention"
        bias = (ctx.bias if ctx.pos_bias is None
                else add_position_bias(ctx.bias, ctx.pos_bias, cfg.gradient_rules))
        attention = token_mixing.self_attention(cfg, modules.attention, self.decoder)
        x_BLD = sublayer(x_BLD, stem, lambda y: attention(cfg, name=stem)(
            y, y, bias, ctx.rope_pos, deterministic, decode, ctx.cache_index))
        if self.pool > 1:
            x_BLD = funnel.mean_pool(x_BLD, self.pool)
        if self.cross and ctx.encoded is not None:
            memory = ctx.encoded
            if cfg.transparent_attention:  # ctx.encoded: every encoder layer's output
                memory = TransparentMemory(cfg, name="transparent_attention")(
                    ctx.encoded, deterministic)
            x_BLD = sublayer(x_BLD, "cross_attention", lambda y: modules.attention(
                cfg, cross=True, name="encoder_decoder_attention")(
                    y, memory, ctx.cross_bias, deterministic=deterministic))
        if layer_plan.has_ffn_sublayer(cfg):
            ffn = layer_plan.ffn_module(cfg, self.ffn_layer, modules.mlp)
            extra = layer_plan.ffn_inputs(self.ffn_layer, ctx, self.decoder)
            x_BLD = sublayer(x_BLD, "mlp", lambda y: ffn(cfg, name="mlp")(
                y, deterministic, **extra))
        if modules.after_mlp is not None:
            x_BLD = modules.after_mlp(cfg, name=modules.after_mlp_name)(x_BLD, deterministic)
        x_BLD = L.constrain(x_BLD, ("batch", "length", "embed"))
        return (x_BLD, None) if self.scanned else x_BLD


class DecodeState(nn.Module):
    """Per-stack cache bookkeeping for decoding: write index and the cached keys' positions and
    segment ids (0 = empty slot), so masks and position biases can be rebuilt each step."""

    @nn.compact
    def __call__(self, positions_BT: Optional[jnp.ndarray], segments_BT: jnp.ndarray):
        b, t = segments_BT.shape
        initialized = self.has_variable("cache", "index")
        index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
        positions = self.variable("cache", "positions", jnp.zeros, (b, t), jnp.int32)
        segments = self.variable("cache", "segments", jnp.zeros, (b, t), jnp.int32)
        start = index.value
        if positions_BT is None:
            positions_BT = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
        if not initialized:  # init_cache: shapes only
            return start, positions_BT, positions_BT, segments_BT
        positions.value = jax.lax.dynamic_update_slice(
            positions.value, positions_BT.astype(jnp.int32), (0, start))
        segments.value = jax.lax.dynamic_update_slice(
            segments.value, segments_BT.astype(jnp.int32), (0, start))
        index.value = start + t
        return start, positions_BT, positions.value, segments.value


class Stack(nn.Module):
    """Embeddings -> layers -> final norm for an encoder (kind="encoder") or decoder."""

    cfg: object
    kind: str  # encoder | decoder
    embedder: nn.Module  # shared token embedding (T5X: top-level token_embedder)
    cross: bool = False  # decoder layers have cross-attention (encoder-decoder)
    # shared encoder-decoder: the decoder Stack whose layers, relative position bias and final
    # norm this encoder uses (the paper's "Enc-dec, shared", as its reference shares all)
    shared: Optional[nn.Module] = None
    # ELECTRA's generator: the stack whose position / token-type embeddings and embedding norm
    # this one uses (the token embedder is shared through ``embedder``)
    embeddings_from: Optional[nn.Module] = None
    modules: StackModules = CORE_MODULES  # block sub-layers and soft prompt (StackModules)

    def setup(self):
        cfg = self.cfg
        embed_width = cfg.embed_dim or cfg.d_model
        if cfg.position == "learned" and self.embeddings_from is None:
            self.position_embedder = L.make_embed(cfg, cfg.max_length, embed_width,
                                                  ("abspos", "embed"))
        if cfg.num_token_types > 0 and self.kind == "encoder" and self.embeddings_from is None:
            self.token_type_embedder = L.make_embed(cfg, cfg.num_token_types, embed_width,
                                                    ("token_types", "embed"))
        if cfg.embed_norm and self.embeddings_from is None:
            self.embed_norm = L.make_norm(cfg)
        if embed_width != cfg.d_model:  # HF ELECTRA's embeddings_project
            self.embed_project = L.make_dense(cfg, cfg.d_model, ("embed", "mlp"), cfg.use_bias)
        if cfg.position == "relative" and self.shared is None:
            bidirectional = self.kind == "encoder" or cfg.architecture == "prefix_lm"
            self.relpos_bias = RelativePositionBias(
                cfg.relative_buckets, cfg.relative_max_distance, cfg.num_heads, bidirectional)
        if self.kind == "decoder":
            self.decode_state = DecodeState()
        if self.num_prompt:
            self.prompt = self.modules.prompt.create(self, cfg)
        if self.shared is None:
            self.layers = self._make_layers()
        if cfg.pre_norm and self.shared is None:
            setattr(self, f"{self.kind}_norm", L.make_norm(cfg))
        if self.kind == "decoder" and not cfg.tie_embeddings:
            self.logits_dense = L.make_dense(cfg, cfg.vocab_size, ("embed", "vocab"), False)
        self.dropout = L.dropout(cfg)
        if cfg.fixup:  # shift (and in the encoder scale) after the last layer
            self.final_fixup = residual.FinalFixup(scale=self.kind == "encoder")

    @property
    def num_prompt(self) -> int:
        """Soft-prompt length (prompt tuning) if this stack gets the prompt, else 0."""
        prompt = self.modules.prompt
        return prompt.tokens if prompt is not None and prompt.stack == self.kind else 0

    def _make_layers(self):
        cfg = self.cfg
        n = cfg.num_encoder_layers if self.kind == "encoder" else cfg.num_decoder_layers
        block = EvolvedBlock if cfg.block_type == "evolved" else Block
        if cfg.remat != "none":
            block = nn.remat(block, policy=REMAT_POLICIES[cfg.remat],
                             prevent_cse=not layer_plan.scanned(cfg, self.kind, n),
                             static_argnums=(3, 4))
        block_fields = dict(cfg=cfg, decoder=self.kind == "decoder", cross=self.cross,
                            modules=self.modules)
        if sharing.shares_block(cfg, self.kind):  # one block's params at every layer
            shared = sharing.SharedBlocks(cfg, block, block_fields,
                                          sharing.applications(cfg, self.kind), cfg.scan_layers)
            return shared if cfg.scan_layers else [shared]
        plan = layer_plan.layer_fields(cfg, self.kind, n)
        if layer_plan.scanned(cfg, self.kind, n):
            scanned = nn.scan(block, variable_axes={"params": 0, "cache": 0,
                                                    moe.AUX_COLLECTION: 0},
                              split_rngs={"params": True, "dropout": True},
                              in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=n,
                              unroll=cfg.scan_unroll or n,
                              metadata_params={nn.PARTITION_NAME: "layers"})
            return scanned(**block_fields, **(plan[0] if plan else {}), scanned=True)
        return [block(**block_fields, **fields) for fields in plan]

    def __call__(self, tokens_BL, positions_BL=None, segments_BL=None, token_types_BL=None,
                 prefix_BL=None, encoded_BSD=None, encoder_tokens_BS=None,
                 encoder_segments_BS=None, deterministic=True, decode=False, layers=None):
        x_BLD, ctx = self.prepare(tokens_BL, positions_BL, segments_BL, token_types_BL, prefix_BL,
                                  encoded_BSD, encoder_tokens_BS, encoder_segments_BS,
                                  deterministic, decode)
        if layer_plan.custom_encoder(self.cfg, self.kind):  # Funnel / transparent attention
            return layer_plan.run_encoder(self, x_BLD, ctx, deterministic)
        x_BLD = self.run_layers(x_BLD, ctx, deterministic, decode, layers)
        return self.finish(x_BLD, deterministic)[:, self.num_prompt:]  # drop the soft prompt

    def prepare(self, tokens_BL, positions_BL=None, segments_BL=None, token_types_BL=None,
                prefix_BL=None, encoded_BSD=None, encoder_tokens_BS=None,
                encoder_segments_BS=None, deterministic=True, decode=False):
        """Embed the tokens and build the per-stack context (mask + position bias, ...)."""
        cfg = self.cfg
        b, t = tokens_BL.shape
        if self.kind == "encoder" and segments_BL is None:  # padding = token 0 (T5, BERT)
            q_valid_BL = tokens_BL != 0
        elif self.kind == "encoder":  # segment 0 = padding; a real token may be id 0 (RoBERTa <s>)
            q_valid_BL = segments_BL != 0
        else:  # decoder inputs start with id 0 (BOS): only segment ids mark padding
            q_valid_BL = jnp.ones((b, t), bool) if segments_BL is None else segments_BL != 0
        flash = cfg.attention_kernel == "flash" and not decode and not self.num_prompt
        if decode:
            seg_BL = jnp.ones((b, t), jnp.int32) if segments_BL is None else segments_BL
            index, positions_BL, k_pos_BS, k_seg_BS = self.decode_state(positions_BL, seg_BL)
            mask_BLS = self._decode_mask(index, seg_BL, k_seg_BS, prefix_BL)
        else:
            if positions_BL is None:
                positions_BL = jnp.broadcast_to(jnp.arange(t), (b, t))
            k_pos_BS = positions_BL
            mask_BLS = None if flash else L.self_attention_mask(q_valid_BL, segments_BL,
                self.kind == "decoder", prefix_BL if cfg.architecture == "prefix_lm" else None)
        x_BLD = self.embed(tokens_BL, positions_BL, token_types_BL, deterministic)
        if flash:  # the kernel makes masks and position biases itself: nothing [T, S] here
            return x_BLD, self._flash_context(q_valid_BL, segments_BL, positions_BL, encoded_BSD,
                                              encoder_tokens_BS, encoder_segments_BS, deterministic)
        if self.num_prompt:  # prompt tuning: soft tokens in front, masks / positions extended
            if decode:
                raise UserError("prompt tuning (model.peft.prompt_tokens) cannot decode a "
                                "decoder-only model with a KV cache; use prefix tuning "
                                "(model.peft.prefix_tokens) or an encoder-decoder model.")
            x_BLD, mask_BLS, positions_BL = self.modules.prompt.prepend(
                self.prompt, x_BLD, mask_BLS, q_valid_BL, positions_BL)
            k_pos_BS = positions_BL
        pos_bias = cache_index = rope_pos = encoded = cross_bias = None
        if cfg.position in ("relative", "alibi"):
            if not decode and not self.num_prompt:  # slot offsets equal position offsets in a
                q_pos, k_pos = (jnp.arange(t)[None],) * 2  # (packed) segment: one [1, H, L, L]
            else:
                q_pos, k_pos = positions_BL, k_pos_BS
            if cfg.position == "relative":
                bidirectional = self.kind == "encoder" or cfg.architecture == "prefix_lm"
                owner = self if self.shared is None else self.shared
                pos_bias = owner.relpos_bias(q_pos, k_pos, bidirectional)
            else:
                pos_bias = alibi_bias(q_pos, k_pos, cfg.num_heads)
        if decode:
            cache_index = index
        if cfg.position == "rope":
            rope_pos = positions_BL
        if encoded_BSD is not None:
            k_valid_BS = encoder_tokens_BS != 0
            encoded = encoded_BSD
            cross_bias = L.attention_bias(L.cross_attention_mask(
                q_valid_BL, k_valid_BS, segments_BL, encoder_segments_BS))
        ctx = LayerContext(bias=L.attention_bias(mask_BLS), pos_bias=pos_bias, rope_pos=rope_pos,
                           cache_index=cache_index, encoded=encoded, cross_bias=cross_bias,
                           valid=self._with_prompt(q_valid_BL))
        return x_BLD, ctx

    def _with_prompt(self, valid_BL):
        """The real-token mask with the soft prompt's positions (real) in front."""
        return jnp.pad(valid_BL, ((0, 0), (self.num_prompt, 0)), constant_values=True)

    def _flash_context(self, q_valid_BL, segments_BL, positions_BL, encoded_BSD,
                       encoder_tokens_BS, encoder_segments_BS, deterministic):
        """The LayerContext for model.attention_kernel="flash": flash_attention.KernelBias
        objects (segment ids, this stack's relative bias table) in place of masks and biases."""
        if encoded_BSD is not None:  # (a Funnel encoder's output is shorter than its ids)
            encoder_tokens_BS, encoder_segments_BS = funnel.pool_ids(
                self.cfg, encoder_tokens_BS, encoder_segments_BS)
        bias, cross_bias = flash_attention.kernel_biases(
            self, q_valid_BL, segments_BL, None if encoded_BSD is None else encoder_tokens_BS,
            encoder_segments_BS, deterministic)
        return LayerContext(bias=bias, rope_pos=positions_BL if self.cfg.position == "rope"
                            else None, encoded=encoded_BSD, cross_bias=cross_bias,
                            valid=q_valid_BL)

    def _decode_mask(self, index, q_seg_BT, k_seg_BS, prefix_BT):
        """Query slot index+t sees filled cache slots <= its own; prefix tokens of this chunk
        see each other (prefix LM prefill)."""
        t, s = q_seg_BT.shape[1], k_seg_BS.shape[1]
        q_slot, k_slot = index + jnp.arange(t), jnp.arange(s)
        allowed = k_slot[None, None, :] <= q_slot[None, :, None]
        if prefix_BT is not None and self.cfg.architecture == "prefix_lm":
            p_BT = prefix_BT.astype(bool)
            p_BS = jax.lax.dynamic_update_slice(jnp.zeros(k_seg_BS.shape, bool), p_BT, (0, index))
            allowed = allowed | (p_BT[:, :, None] & p_BS[:, None, :])
        same = (q_seg_BT[:, :, None] == k_seg_BS[:, None, :]) & (k_seg_BS[:, None, :] != 0)
        return allowed & same

    def embed(self, tokens_BL, positions_BL, token_types_BL=None, deterministic=True):
        cfg = self.cfg
        owner = self if self.embeddings_from is None else self.embeddings_from
        x_BLD = self.embedder(tokens_BL)
        if cfg.embed_like_classifier:  # architectures.token_embedder: N(0, 1 / width)
            x_BLD = x_BLD * jnp.asarray(x_BLD.shape[-1] ** 0.5, x_BLD.dtype)
        if cfg.position == "learned":
            x_BLD = x_BLD + owner.position_embedder(positions_BL)
        elif cfg.position == "sinusoidal":
            x_BLD = x_BLD + sinusoidal(positions_BL, cfg.d_model).astype(x_BLD.dtype)
        if cfg.num_token_types > 0 and self.kind == "encoder":
            if token_types_BL is None:
                token_types_BL = jnp.zeros_like(tokens_BL)
            x_BLD = x_BLD + owner.token_type_embedder(token_types_BL)
        if cfg.embed_norm:
            x_BLD = owner.embed_norm(x_BLD)
        x_BLD = self.dropout(x_BLD, deterministic=deterministic)
        if (cfg.embed_dim or cfg.d_model) != cfg.d_model:
            x_BLD = self.embed_project(x_BLD)
        return L.constrain(x_BLD, ("batch", "length", "embed"))

    def run_layers(self, x_BLD, ctx, deterministic=True, decode=False, layers=None):
        """``layers``: another stack's layers (shared encoder-decoder); default this stack's."""
        if layers is None:
            layers = self.layers if self.shared is None else self.shared.layers
        if not isinstance(layers, (list, tuple)):  # one scanned layer
            x_BLD, _ = layers(x_BLD, ctx, deterministic, decode)
            return x_BLD
        for layer in layers:
            x_BLD = layer(x_BLD, ctx, deterministic, decode)
        return x_BLD

    def finish(self, x_BLD, deterministic=True):
        if self.cfg.pre_norm:
            x_BLD = (getattr(self, f"{self.kind}_norm") if self.shared is None
                     else self.shared.decoder_norm)(x_BLD)
        x_BLD = self.dropout(x_BLD, deterministic=deterministic)
        return self.final_fixup(x_BLD) if self.cfg.fixup else x_BLD

    def logits(self, x_BLD):
        """Output projection: tied embedding (T5 v1.0 rescales by d_model**-0.5) or logits_dense."""
        cfg = self.cfg
        if hasattr(self.embedder, "vocab_logits"):  # models/vocab_layers.py
            logits_BLV = self.embedder.vocab_logits(x_BLD)
        elif cfg.tie_embeddings:
            if cfg.scale_tied_logits:
                x_BLD = x_BLD * jnp.asarray(cfg.d_model ** -0.5, x_BLD.dtype)
            logits_BLV = self.embedder.attend(x_BLD)
        else:
            logits_BLV = self.logits_dense(x_BLD)
        return L.constrain(logits_BLV.astype(jnp.float32), ("batch", "length", "vocab"))
