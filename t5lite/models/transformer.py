"""One Transformer Block, and the Stack (embeddings, masks, layers, final norm) built from it.

A Stack is an encoder (bidirectional) or a decoder (causal, optional prefix-LM and cross-
attention). Masks and position biases are built once per stack and shared by all layers as
additive biases (T5 shares its relative bias across layers). Layers are scanned (params stacked
on a leading "layers" axis, named ``layers``) or unrolled (``layers_0``, ``layers_1``, ...), and
optionally rematerialised; both give identical numerics. What a Stack and its Blocks build
(block type, token mixer, attention backend, FFNs, residual arrangement, sharing, embeddings,
output layer) is its plan.StackPlan, resolved once from the config by models/plan.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.errors import UserError
from t5lite.models import funnel
from t5lite.models import layers as L
from t5lite.models import residual, sharing, transparent
from t5lite.models.gradient_rules import add_position_bias
from t5lite.models.moe import AUX_COLLECTION
from t5lite.models.positions import RelativePositionBias, alibi_bias, sinusoidal
from t5lite.models.registry import BlockType, OutputLayer

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
    # how the layers' dot-product attention reads bias / cross_bias (registry.AttentionBackend)
    backend: Any = flax.struct.field(pytree_node=False, default=L.XLA_ATTENTION)


class Block(nn.Module):
    """Self-attention, optional cross-attention, MLP; each a residual sub-layer, pre- or post-norm.

    Parameter names follow T5X: encoder blocks have ``attention`` / ``pre_attention_layer_norm``;
    decoder blocks ``self_attention``, ``encoder_decoder_attention`` with
    ``pre_self_attention_layer_norm`` / ``pre_cross_attention_layer_norm``; both ``mlp`` and
    ``pre_mlp_layer_norm``. Post-norm blocks name the norms ``post_*`` instead of ``pre_*``.
    ``ctx`` (a LayerContext) holds the arrays shared by all layers. What the sub-layers are
    comes from ``plan`` (the stack's plan.StackPlan) and ``layer`` (this layer's LayerPlan).
    """

    plan: Any  # plan.StackPlan
    layer: Any  # plan.LayerPlan
    scanned: bool = False

    @nn.compact
    def __call__(self, x_BLD, ctx: LayerContext, deterministic=True, decode=False):
        plan, layer = self.plan, self.layer
        cfg, modules = plan.cfg, plan.modules

        def sublayer(x, stem, fn):  # x + branch: norms, ReZero / Fixup scalars, gating
            return residual.sublayer(self, cfg, x, stem, fn, deterministic, plan.residual)

        stem = "self_attention" if plan.decoder else "attention"
        bias = (ctx.bias if ctx.pos_bias is None
                else add_position_bias(ctx.bias, ctx.pos_bias, cfg.gradient_rules))
        attention = plan.mixer.build(modules.attention, plan.decoder, ctx.backend)
        x_BLD = sublayer(x_BLD, stem, lambda y: attention(cfg, name=stem)(
            y, y, bias, ctx.rope_pos, deterministic, decode, ctx.cache_index))
        if layer.pool > 1:
            x_BLD = funnel.mean_pool(x_BLD, layer.pool)
        if plan.cross and ctx.encoded is not None:
            memory = ctx.encoded
            if plan.cross_memory is not None:  # ctx.encoded: every encoder layer's output
                memory = plan.cross_memory(cfg, name="transparent_attention")(
                    ctx.encoded, deterministic)
            x_BLD = sublayer(x_BLD, "cross_attention", lambda y: modules.attention(
                cfg, cross=True, backend=ctx.backend, name="encoder_decoder_attention")(
                    y, memory, ctx.cross_bias, deterministic=deterministic))
        if plan.ffn_sublayer:
            ffn = layer.ffn.module or modules.mlp
            extra = dict(valid_BL=ctx.valid, decoder=plan.decoder) if layer.ffn.routed else {}
            x_BLD = sublayer(x_BLD, "mlp", lambda y: ffn(cfg, name="mlp")(
                y, deterministic, **extra))
        if modules.after_mlp is not None:
            x_BLD = modules.after_mlp(cfg, name=modules.after_mlp_name)(x_BLD, deterministic)
        x_BLD = L.constrain(x_BLD, ("batch", "length", "embed"))
        return (x_BLD, None) if self.scanned else x_BLD


# model.block_type="transformer" (registered in models/plan.py)
BLOCK = BlockType("transformer", Block)


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
    """Embeddings -> layers -> final norm for an encoder (plan.kind "encoder") or decoder, as
    its ``plan`` (plan.StackPlan, resolved once from the config) says."""

    plan: Any  # plan.StackPlan
    embedder: nn.Module  # shared token embedding (T5X: top-level token_embedder)
    # shared encoder-decoder: the decoder Stack whose layers, relative position bias and final
    # norm this encoder uses (the paper's "Enc-dec, shared", as its reference shares all)
    shared: Optional[nn.Module] = None
    # ELECTRA's generator: the stack whose position / token-type embeddings and embedding norm
    # this one uses (the token embedder is shared through ``embedder``)
    embeddings_from: Optional[nn.Module] = None

    @property
    def cfg(self):
        """The stack's ModelConfig (sizes, dtypes, initializers for its modules)."""
        return self.plan.cfg

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def modules(self) -> StackModules:
        return self.plan.modules

    def setup(self):
        plan, cfg, emb = self.plan, self.plan.cfg, self.plan.embeddings
        own = self.embeddings_from is None
        if emb.learned_positions and own:
            self.position_embedder = L.make_embed(cfg, cfg.max_length, emb.width,
                                                  ("abspos", "embed"))
        if emb.token_types and own:
            self.token_type_embedder = L.make_embed(cfg, emb.token_types, emb.width,
                                                    ("token_types", "embed"))
        if emb.norm and own:
            self.embed_norm = L.make_norm(cfg)
        if emb.project:  # HF ELECTRA's embeddings_project
            self.embed_project = L.make_dense(cfg, cfg.d_model, ("embed", "mlp"), cfg.use_bias)
        if plan.position == "relative" and self.shared is None:
            self.relpos_bias = RelativePositionBias(
                cfg.relative_buckets, cfg.relative_max_distance, cfg.num_heads,
                plan.bidirectional)
        if plan.decoder:
            self.decode_state = DecodeState()
        if self.num_prompt:
            self.prompt = self.modules.prompt.create(self, cfg)
        if self.shared is None:
            self.layers = self._make_layers()
        if plan.final_norm and self.shared is None:
            setattr(self, f"{self.kind}_norm", L.make_norm(cfg))
        if plan.decoder and plan.output.owns_dense:
            self.logits_dense = L.make_dense(cfg, cfg.vocab_size, ("embed", "vocab"), False)
        self.dropout = L.dropout(cfg)
        if plan.final_fixup:  # shift (and in the encoder scale) after the last layer
            self.final_fixup = residual.FinalFixup(scale=self.kind == "encoder")

    @property
    def num_prompt(self) -> int:
        """Soft-prompt length (prompt tuning) if this stack gets the prompt, else 0."""
        prompt = self.modules.prompt
        return prompt.tokens if prompt is not None and prompt.stack == self.kind else 0

    def _make_layers(self):
        plan = self.plan
        block = plan.block.module
        if plan.remat is not None:
            block = nn.remat(block, policy=plan.remat, prevent_cse=not plan.scanned,
                             static_argnums=(3, 4))
        if plan.shared_applications:  # one block's params at every layer
            shared = sharing.SharedBlocks(plan.cfg, block, dict(plan=plan, layer=plan.shared_layer),
                                          plan.shared_applications, plan.shared_scanned)
            return shared if plan.shared_scanned else [shared]
        if plan.scanned:
            n = len(plan.layers)
            scanned = nn.scan(block, variable_axes={"params": 0, "cache": 0,
                                                    AUX_COLLECTION: 0},
                              split_rngs={"params": True, "dropout": True},
                              in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=n,
                              unroll=plan.scan_unroll or n,
                              metadata_params={nn.PARTITION_NAME: "layers"})
            return scanned(plan=plan, layer=plan.layers[0] if n else plan.shared_layer,
                           scanned=True)
        return [block(plan=plan, layer=layer) for layer in plan.layers]

    def __call__(self, tokens_BL, positions_BL=None, segments_BL=None, token_types_BL=None,
                 prefix_BL=None, encoded_BSD=None, encoder_tokens_BS=None,
                 encoder_segments_BS=None, deterministic=True, decode=False, layers=None):
        x_BLD, ctx = self.prepare(tokens_BL, positions_BL, segments_BL, token_types_BL, prefix_BL,
                                  encoded_BSD, encoder_tokens_BS, encoder_segments_BS,
                                  deterministic, decode)
        if self.plan.encoder_loop:  # Funnel / transparent attention
            return self.run_encoder(x_BLD, ctx, deterministic)
        x_BLD = self.run_layers(x_BLD, ctx, deterministic, decode, layers)
        return self.finish(x_BLD, deterministic)[:, self.num_prompt:]  # drop the soft prompt

    def prepare(self, tokens_BL, positions_BL=None, segments_BL=None, token_types_BL=None,
                prefix_BL=None, encoded_BSD=None, encoder_tokens_BS=None,
                encoder_segments_BS=None, deterministic=True, decode=False):
        """Embed the tokens and build the per-stack context (mask + position bias, ...)."""
        plan = self.plan
        b, t = tokens_BL.shape
        if self.kind == "encoder" and segments_BL is None:  # padding = token 0 (T5, BERT)
            q_valid_BL = tokens_BL != 0
        elif self.kind == "encoder":  # segment 0 = padding; a real token may be id 0 (RoBERTa <s>)
            q_valid_BL = segments_BL != 0
        else:  # decoder inputs start with id 0 (BOS): only segment ids mark padding
            q_valid_BL = jnp.ones((b, t), bool) if segments_BL is None else segments_BL != 0
        backend = plan.backend_for(decode, bool(self.num_prompt), deterministic)
        arrays = backend.context is None  # else the backend makes masks / biases itself
        if decode:
            seg_BL = jnp.ones((b, t), jnp.int32) if segments_BL is None else segments_BL
            index, positions_BL, k_pos_BS, k_seg_BS = self.decode_state(positions_BL, seg_BL)
            mask_BLS = self._decode_mask(index, seg_BL, k_seg_BS, prefix_BL)
        else:
            if positions_BL is None:
                positions_BL = jnp.broadcast_to(jnp.arange(t), (b, t))
            k_pos_BS = positions_BL
            mask_BLS = None if not arrays else L.self_attention_mask(
                q_valid_BL, segments_BL, plan.decoder, prefix_BL if plan.prefix_lm else None)
        x_BLD = self.embed(tokens_BL, positions_BL, token_types_BL, deterministic)
        rope_pos = positions_BL if plan.position == "rope" else None
        if not arrays:  # nothing [T, S] here: the backend's context
            return x_BLD, backend.context(self, q_valid_BL, segments_BL, rope_pos, encoded_BSD,
                                          encoder_tokens_BS, encoder_segments_BS, deterministic)
        if self.num_prompt:  # prompt tuning: soft tokens in front, masks / positions extended
            if decode:
                raise UserError("prompt tuning (model.peft.prompt_tokens) cannot decode a "
                                "decoder-only model with a KV cache; use prefix tuning "
                                "(model.peft.prefix_tokens) or an encoder-decoder model.")
            x_BLD, mask_BLS, positions_BL = self.modules.prompt.prepend(
                self.prompt, x_BLD, mask_BLS, q_valid_BL, positions_BL)
            k_pos_BS = positions_BL
            rope_pos = positions_BL if plan.position == "rope" else None
        pos_bias = self._position_bias(positions_BL, k_pos_BS, t, decode)
        cross_bias = None
        if encoded_BSD is not None:
            cross_bias = L.attention_bias(L.cross_attention_mask(
                q_valid_BL, encoder_tokens_BS != 0, segments_BL, encoder_segments_BS))
        ctx = LayerContext(bias=L.attention_bias(mask_BLS), pos_bias=pos_bias,
                           rope_pos=rope_pos, cache_index=index if decode else None,
                           encoded=encoded_BSD, cross_bias=cross_bias,
                           valid=self._with_prompt(q_valid_BL), backend=backend)
        return x_BLD, ctx

    def _position_bias(self, positions_BL, k_pos_BS, t: int, decode: bool):
        """The relative / ALiBi position bias [1 or B, H, T, S] (None for other positions)."""
        plan = self.plan
        if plan.position not in ("relative", "alibi"):
            return None
        if not decode and not self.num_prompt:  # slot offsets equal position offsets in a
            q_pos, k_pos = (jnp.arange(t)[None],) * 2  # (packed) segment: one [1, H, L, L]
        else:
            q_pos, k_pos = positions_BL, k_pos_BS
        if plan.position == "relative":
            owner = self if self.shared is None else self.shared
            return owner.relpos_bias(q_pos, k_pos, plan.bidirectional)
        return alibi_bias(q_pos, k_pos, self.cfg.num_heads)

    def _with_prompt(self, valid_BL):
        """The real-token mask with the soft prompt's positions (real) in front."""
        return jnp.pad(valid_BL, ((0, 0), (self.num_prompt, 0)), constant_values=True)

    def _decode_mask(self, index, q_seg_BT, k_seg_BS, prefix_BT):
        """Query slot index+t sees filled cache slots <= its own; prefix tokens of this chunk
        see each other (prefix LM prefill)."""
        t, s = q_seg_BT.shape[1], k_seg_BS.shape[1]
        q_slot, k_slot = index + jnp.arange(t), jnp.arange(s)
        allowed = k_slot[None, None, :] <= q_slot[None, :, None]
        if prefix_BT is not None and self.plan.prefix_lm:
            p_BT = prefix_BT.astype(bool)
            p_BS = jax.lax.dynamic_update_slice(jnp.zeros(k_seg_BS.shape, bool), p_BT, (0, index))
            allowed = allowed | (p_BT[:, :, None] & p_BS[:, None, :])
        same = (q_seg_BT[:, :, None] == k_seg_BS[:, None, :]) & (k_seg_BS[:, None, :] != 0)
        return allowed & same

    def embed(self, tokens_BL, positions_BL, token_types_BL=None, deterministic=True):
        cfg, emb = self.cfg, self.plan.embeddings
        owner = self if self.embeddings_from is None else self.embeddings_from
        x_BLD = self.embedder(tokens_BL)
        if emb.classifier_scale:  # plan.token_embedder: N(0, 1 / width)
            x_BLD = x_BLD * jnp.asarray(x_BLD.shape[-1] ** 0.5, x_BLD.dtype)
        if emb.learned_positions:
            x_BLD = x_BLD + owner.position_embedder(positions_BL)
        elif emb.sinusoidal:
            x_BLD = x_BLD + sinusoidal(positions_BL, cfg.d_model).astype(x_BLD.dtype)
        if emb.token_types:
            if token_types_BL is None:
                token_types_BL = jnp.zeros_like(tokens_BL)
            x_BLD = x_BLD + owner.token_type_embedder(token_types_BL)
        if emb.norm:
            x_BLD = owner.embed_norm(x_BLD)
        x_BLD = self.dropout(x_BLD, deterministic=deterministic)
        if emb.project:
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

    def run_encoder(self, x_BLD, ctx, deterministic=True):
        """The encoder's layers one by one: a layer that pools (Funnel) shortens the context
        for the layers after it; with transparent attention the result is every layer's output
        stacked [B, N+1, S, D] (transparent.stack_outputs), else the final output [B, S', D]."""
        outputs = [x_BLD]
        for layer, layer_plan in zip(self.layers, self.plan.layers):
            x_BLD = layer(x_BLD, ctx, deterministic, False)
            if layer_plan.pool > 1:
                ctx = funnel.pool_context(ctx, layer_plan.pool)
            outputs.append(x_BLD)
        final_BLD = self.finish(x_BLD, deterministic)
        if not self.plan.transparent:
            return final_BLD
        return transparent.stack_outputs(outputs[:-1] + [final_BLD])

    def finish(self, x_BLD, deterministic=True):
        if self.plan.final_norm:
            x_BLD = (getattr(self, f"{self.kind}_norm") if self.shared is None
                     else self.shared.decoder_norm)(x_BLD)
        x_BLD = self.dropout(x_BLD, deterministic=deterministic)
        return self.final_fixup(x_BLD) if self.plan.final_fixup else x_BLD

    def logits(self, x_BLD):
        """The output layer the plan chose (OUTPUT_LAYERS, vocab_layers.VOCAB_LOGITS), float32."""
        logits_BLV = self.plan.output.logits(self, x_BLD)
        return L.constrain(logits_BLV.astype(jnp.float32), ("batch", "length", "vocab"))


def _tied_logits(stack, x_BLD):
    return stack.embedder.attend(x_BLD)


def _tied_scaled_logits(stack, x_BLD):
    """T5 v1.0: the decoder output times d_model**-0.5 before the tied embedding."""
    x_BLD = x_BLD * jnp.asarray(stack.cfg.d_model ** -0.5, x_BLD.dtype)
    return stack.embedder.attend(x_BLD)


def _dense_logits(stack, x_BLD):
    return stack.logits_dense(x_BLD)


# the decoder's output layer: the tied embedding (model.scale_tied_logits: rescaled first) or
# its own logits_dense (model.tie_embeddings=False); registered in models/plan.py
OUTPUT_LAYERS = (OutputLayer("tied", _tied_logits),
                 OutputLayer("tied_scaled", _tied_scaled_logits),
                 OutputLayer("dense", _dense_logits, owns_dense=True))
