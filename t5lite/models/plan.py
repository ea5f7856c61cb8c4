"""The one seam between a ModelConfig and the modules: a frozen StackPlan, resolved once per
stack from the config, that Stack and Block consume. Every choice among model variants is
made here, from the registries below (each entry declared beside its variant's code; kinds
in models/registry.py): the token mixer, the attention backend, each layer's FFN and pooling,
the residual / norm arrangement, the block type, block sharing, the embeddings and the output
layer. Stack and Block read the plan, never a variant field of the config.

A stack whose layers are not all alike (an FFN replaced in some layers only, Funnel pooling,
transparent attention's per-layer outputs) is built unscanned (``layers_0`` ...), whatever
model.scan_layers says: nn.scan needs one layer repeated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn

from t5lite.models import electra, evolved, flash_attention, funnel, gpu_attention, layers
from t5lite.models import local_conv, moe
from t5lite.models import pkm, residual, sharing, synthesizer, transparent, vocab_layers
from t5lite.models.registry import AttentionBackend, BlockType, FFNLayer, OutputLayer, TokenMixer
from t5lite.models.embeddings import FactorizedEmbed
from t5lite.models.transformer import (BLOCK, CORE_MODULES, OUTPUT_LAYERS, REMAT_POLICIES,
                                       StackModules)
from t5lite.models.weighted import BranchedAttention


def _registry(*entries) -> dict:
    out = {}
    for entry in entries:
        for name in getattr(entry, "names", None) or (entry.name,):
            assert name not in out, f"two variants registered as {name!r}"
            out[name] = entry
    return out


# ----------------------------------------------------------------------------- registries
# (adding a variant: its file defines its entry; one line here lists it)
ATTENTION_BACKENDS = _registry(layers.XLA_ATTENTION, flash_attention.FLASH_ATTENTION,
                               gpu_attention.CUDNN_ATTENTION, gpu_attention.FLASH_GPU_ATTENTION,
                               gpu_attention.AUTO_ATTENTION)
TOKEN_MIXERS = _registry(layers.MULTIHEAD, synthesizer.SYNTHESIZER, local_conv.CONVOLUTION)
FFN_LAYERS = _registry(layers.DENSE_FFN, moe.MOE, moe.SWITCH, pkm.PKM)
BLOCK_TYPES = _registry(BLOCK, evolved.EVOLVED_BLOCK)
OUTPUTS = _registry(*OUTPUT_LAYERS, vocab_layers.VOCAB_LOGITS)


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """What one layer of a stack gets: its FFN and Funnel pooling after its self-attention
    (1 = none)."""

    ffn: FFNLayer = layers.DENSE_FFN
    pool: int = 1


@dataclasses.dataclass(frozen=True)
class EmbeddingPlan:
    """A stack's input embeddings besides the token embedder."""

    width: int  # model.embed_dim or d_model; != d_model: embed_project maps it to d_model
    project: bool
    learned_positions: bool  # a position_embedder table
    sinusoidal: bool
    token_types: int  # a token_type_embedder of this many types (encoders only)
    norm: bool  # embed_norm after the sum
    classifier_scale: bool  # lookup times sqrt(width) (model.embed_like_classifier)


@dataclasses.dataclass(frozen=True, eq=False)
class StackPlan:
    """Everything a Stack and its Blocks build, resolved from the stack's ModelConfig ``cfg``
    (which the sub-layers still read for sizes, dtypes and initializers)."""

    cfg: Any
    kind: str  # encoder | decoder
    cross: bool  # decoder layers with cross-attention
    modules: StackModules  # dot-product attention / MLP classes, after_mlp, soft prompt
    block: BlockType
    mixer: TokenMixer  # the self-attention sub-layer
    backend: AttentionBackend
    cross_memory: Optional[type]  # decoder: what makes the cross-attention memory (None: encoded)
    residual: residual.Arrangement
    # blocks have an FFN sub-layer (the Weighted Transformer's FFN is inside its attention)
    ffn_sublayer: bool
    layers: tuple  # LayerPlan per layer
    scanned: bool  # one nn.scan layer (all layers alike and model.scan_layers)
    scan_unroll: int  # layers per scan iteration (0: all)
    remat: Optional[Any]  # the layers' jax.checkpoint policy (None: no remat)
    shared_applications: int  # >0: one shared block applied this many times (sharing.py) ...
    shared_scanned: bool  # ... as a scan (its params stacked by nn.scan's broadcast)
    shared_layer: LayerPlan  # the LayerPlan of a shared block (and of an empty stack's scan)
    encoder_loop: bool  # layers one by one (Funnel pooling, transparent attention's outputs)
    transparent: bool  # encoder: every layer's output, stacked
    embeddings: EmbeddingPlan
    output: OutputLayer  # the decoder's vocabulary projection
    position: str  # relative | learned | sinusoidal | rope | alibi
    prefix_lm: bool  # the decoder's prefix is bidirectional
    bidirectional: bool  # relative position buckets in both directions
    final_norm: bool  # a norm after the last layer (pre-norm stacks)
    final_fixup: bool  # Fixup's scalar shift (and scale in an encoder) after the last layer

    @property
    def decoder(self) -> bool:
        return self.kind == "decoder"

    def backend_for(self, decode: bool, prompted: bool,
                    deterministic: bool = True) -> AttentionBackend:
        """The configured backend ("auto": the one it picks for this trace's backend and
        mode), or the arrays one (XLA) where a backend with its own context cannot run:
        decoding with a KV cache, a soft prompt in front."""
        backend = self.backend
        if backend.choose is not None:
            backend = backend.choose(self.cfg, deterministic)
        if backend.context is not None and (decode or prompted):
            return layers.XLA_ATTENTION
        return backend


def ffn_layer_at(cfg, kind: str, index: int, depth: int) -> str:
    """The FFN kind ("dense", "moe", "switch", "pkm") of layer ``index`` of a ``kind`` stack
    of ``depth`` layers."""
    if cfg.ffn_layer == "dense" or cfg.ffn_layer_stacks not in ("both", kind):
        return "dense"
    if cfg.ffn_layer_at:
        chosen = {i % depth for i in cfg.ffn_layer_at if -depth <= i < depth}
        return cfg.ffn_layer if index in chosen else "dense"
    return cfg.ffn_layer if (index + 1) % cfg.ffn_layer_every == 0 else "dense"


def layer_plans(cfg, kind: str) -> tuple:
    """The LayerPlan of each layer of a ``kind`` stack."""
    depth = cfg.num_encoder_layers if kind == "encoder" else cfg.num_decoder_layers
    return tuple(LayerPlan(FFN_LAYERS[ffn_layer_at(cfg, kind, i, depth)],
                           funnel.pool_at(cfg, kind, i)) for i in range(depth))


def layers_alike(cfg) -> bool:
    """Every layer of each stack has the same parameters (a stack's count is one layer's times
    its depth; Funnel blocks need their whole depth to validate)."""
    if cfg.funnel_blocks:
        return False
    return all(len(set(layer_plans(cfg, kind))) <= 1 for kind in ("encoder", "decoder"))


def core_modules(cfg, modules: StackModules) -> StackModules:
    """The StackModules for ``cfg``: branched attention for the Weighted Transformer."""
    if cfg.weighted_transformer:
        return modules._replace(attention=BranchedAttention)
    return modules


def embedding_plan(cfg, kind: str) -> EmbeddingPlan:
    width = cfg.embed_dim or cfg.d_model
    return EmbeddingPlan(
        width=width, project=width != cfg.d_model, learned_positions=cfg.position == "learned",
        sinusoidal=cfg.position == "sinusoidal",
        token_types=cfg.num_token_types if kind == "encoder" else 0, norm=cfg.embed_norm,
        classifier_scale=cfg.embed_like_classifier)


def output_layer(cfg) -> OutputLayer:
    if vocab_layers.vocab_layer_kind(cfg):
        return OUTPUTS["vocab_logits"]
    if not cfg.tie_embeddings:
        return OUTPUTS["dense"]
    return OUTPUTS["tied_scaled" if cfg.scale_tied_logits else "tied"]


def token_embedder(cfg) -> nn.Module:
    """The model's token embedder (shared by its stacks): ALBERT's factorized one, a
    vocabulary layer (adaptive input / softmax, mixture of softmaxes: vocab_layers.py; it also
    makes the decoder's output) or a plain Embed."""
    if cfg.factorized_embed_dim:  # ALBERT's [V, E] x [E, D]
        return FactorizedEmbed(cfg)
    if vocab_layers.vocab_layer_kind(cfg):
        return vocab_layers.make_vocab_layer(cfg)
    width = cfg.embed_dim or cfg.d_model
    # embed_like_classifier: Stack.embed multiplies the lookup by sqrt(width)
    init = nn.initializers.normal(width ** -0.5) if cfg.embed_like_classifier else None
    return layers.make_embed(cfg, cfg.vocab_size, width, ("vocab", "embed"), init)


def stack_plan(cfg, kind: str, modules: StackModules = CORE_MODULES,
               cross: bool = False) -> StackPlan:
    """The plan of a ``kind`` ("encoder" / "decoder") stack of ``cfg`` (a ModelConfig; the
    encoder's with model.encoder_norm applied), built from ``modules``; ``cross``: decoder
    layers with cross-attention."""
    plans = layer_plans(cfg, kind)
    encoder_loop = kind == "encoder" and bool(cfg.funnel_blocks or cfg.transparent_attention)
    shared = sharing.applications(cfg, kind) if sharing.shares_block(cfg, kind) else 0
    return StackPlan(
        cfg=cfg, kind=kind, cross=cross, modules=core_modules(cfg, modules),
        block=BLOCK_TYPES[cfg.block_type], mixer=TOKEN_MIXERS[cfg.attention_type],
        backend=ATTENTION_BACKENDS[cfg.attention_kernel],
        cross_memory=(transparent.TransparentMemory if cfg.transparent_attention
                      and kind == "decoder" else None),
        residual=residual.arrangement(cfg), layers=plans,
        scanned=cfg.scan_layers and len(set(plans)) <= 1 and not encoder_loop,
        scan_unroll=cfg.scan_unroll, remat=REMAT_POLICIES.get(cfg.remat),
        shared_applications=shared, shared_scanned=cfg.scan_layers,
        shared_layer=LayerPlan(), ffn_sublayer=not cfg.weighted_transformer,
        encoder_loop=encoder_loop, transparent=cfg.transparent_attention,
        embeddings=embedding_plan(cfg, kind), output=output_layer(cfg), position=cfg.position,
        prefix_lm=cfg.architecture == "prefix_lm",
        bidirectional=kind == "encoder" or cfg.architecture == "prefix_lm",
        final_norm=cfg.pre_norm, final_fixup=cfg.fixup)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelPlan:
    """The plans of a model's stacks (None where the architecture has no such stack) and its
    token embedder; what build_model hands the architecture."""

    cfg: Any
    encoder: Optional[StackPlan] = None
    decoder: Optional[StackPlan] = None
    generator: Optional[StackPlan] = None  # ELECTRA's generator (electra.generator_config)

    def token_embedder(self) -> nn.Module:
        return token_embedder(self.cfg)


def encoder_config(cfg):
    """The encoder stack's ModelConfig: model.encoder_norm, when set, as its model.norm (the
    Funnel row: funnel_transformer.gin's encoder layers and final norm are sublayer_rms_norm,
    google-research transformer_modifications/gin/models/funnel_transformer.gin :17-27)."""
    return dataclasses.replace(cfg, norm=cfg.encoder_norm) if cfg.encoder_norm else cfg


def model_plan(cfg, modules: StackModules = CORE_MODULES) -> ModelPlan:
    """The ModelPlan of ``cfg`` (a ModelConfig), its stacks built from ``modules``."""
    encoder = decoder = generator = None
    if cfg.architecture in ("encoder_decoder", "encoder_only"):
        encoder = stack_plan(encoder_config(cfg), "encoder", modules)
    if cfg.architecture != "encoder_only":
        decoder = stack_plan(cfg, "decoder", modules, cross=cfg.architecture == "encoder_decoder")
    rtd = cfg.electra
    if rtd.rtd_head and rtd.generator_d_model and cfg.num_classes == 0:
        generator = stack_plan(electra.generator_config(cfg), "encoder", modules)
    return ModelPlan(cfg, encoder, decoder, generator)
