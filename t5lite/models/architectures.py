"""The three model families as thin wrappers around Stack: EncoderDecoder (T5), DecoderOnly (GPT,
LM, prefix LM) and EncoderOnly (BERT). Variants are ModelConfig fields, never subclasses.

Parameter tree (T5X layout; ``layers`` is the scanned stack with a leading [num_layers] axis,
``layers_0 ... layers_{N-1}`` when cfg.scan_layers=False). Kernels are stored as
[fan_in, fan_out] matrices with model.flat_kernels (the default): query/key/value [D, H*K]
("embed", "heads"), out [H*K, D] ("heads", "embed"); without it query/key/value [D, H, K]
("embed", "heads", "kv") and out [H, K, D]. mlp wi / wi_0 / wi_1 [D, F] ("embed", "mlp"), wo
[F, D]; norms have ``scale`` [D] (+ ``bias`` for layernorm); ``bias`` on dense layers when
cfg.use_bias. The Stack's modules (StackModules: PEFT subclasses and extra modules that
build_model passes in) add their params inside the modules they adapt (t5lite/peft). What each
stack builds comes from its plan.StackPlan (build_model resolves the plan.ModelPlan once).

EncoderDecoder (T5)::

    token_embedder/embedding                         [V, D] (shared by encoder, decoder, tied head)
    encoder/relpos_bias/rel_embedding                [H, buckets]  (position="relative")
    encoder/position_embedder/embedding              [max_length, D] (position="learned")
    encoder/layers/pre_attention_layer_norm/scale
    encoder/layers/attention/{query,key,value,out}/kernel
    encoder/layers/pre_mlp_layer_norm/scale
    encoder/layers/mlp/{wi | wi_0, wi_1}/kernel, mlp/wo/kernel
    encoder/encoder_norm/scale
    decoder/relpos_bias/rel_embedding
    decoder/layers/pre_self_attention_layer_norm/scale
    decoder/layers/self_attention/{query,key,value,out}/kernel
    decoder/layers/pre_cross_attention_layer_norm/scale
    decoder/layers/encoder_decoder_attention/{query,key,value,out}/kernel
    decoder/layers/pre_mlp_layer_norm/scale
    decoder/layers/mlp/...
    decoder/decoder_norm/scale
    decoder/logits_dense/kernel                      [D, V] (tie_embeddings=False, T5 v1.1)

  shared_encoder_decoder=True: no encoder params; the encoder runs decoder/layers (skipping
  their cross-attention), decoder/relpos_bias (with bidirectional buckets) and
  decoder/decoder_norm, as the paper's reference shares all of them.

DecoderOnly (GPT-2: position="learned", layernorm with bias, use_bias=True)::

    token_embedder/embedding                         [V, D] (tied LM head, no rescale)
    decoder/position_embedder/embedding              [max_length, D]
    decoder/layers/{pre_self_attention_layer_norm, self_attention, pre_mlp_layer_norm, mlp}/...
    decoder/decoder_norm/{scale, bias}
    decoder/logits_dense/kernel                      (tie_embeddings=False)
    class_dense/{kernel [D, C], bias [C]}            (num_classes > 0)

EncoderOnly (BERT: post-norm, embed_norm, token types, use_bias=True)::

    token_embedder/embedding                         [V, D] (E = model.embed_dim when set)
    encoder/position_embedder/embedding              [max_length, D]
    encoder/token_type_embedder/embedding            [num_token_types, D]
    encoder/embed_norm/{scale, bias}                 (embedding LayerNorm)
    encoder/embed_project/{kernel [E, D], bias}      (model.embed_dim = E != D; ELECTRA)
    encoder/layers/attention/{query,key,value,out}/{kernel, bias}
    encoder/layers/post_attention_layer_norm/{scale, bias}
    encoder/layers/mlp/{wi, wo}/{kernel, bias}
    encoder/layers/post_mlp_layer_norm/{scale, bias}
    mlm_dense/{kernel [D, D], bias}, mlm_norm/{scale, bias}   (MLM transform)
    mlm_bias                                         [V] (output bias; output tied to embedding)
    pooler/{kernel [D, D], bias}                     (pooler or nsp_head; tanh on [CLS])
    nsp_dense/{kernel [D, 2], bias}                  (nsp_head)
    class_dense/{kernel [D, C], bias}                (num_classes > 0; on the pooled [CLS])
    token_dense/{kernel [D, C], bias}                (num_token_classes > 0; every token)
    span_dense/{kernel [D, 2], bias}                 (span_head: start / end logits)
    sbo/...                                          (sbo_head: SpanBERT, see models/sbo.py)

Heads (mlm_*, nsp_dense, class_dense, token_dense, span_dense, sbo) are what
``count_params(cfg, heads=False)`` leaves out.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import funnel
from t5lite.models import layers as L
from t5lite.models.sbo import SpanBoundaryHead
from t5lite.models.transformer import Stack


def head_dense(cfg, features: int, axes):
    """A task head's dense layer (with bias)."""
    return L.make_dense(cfg, features, axes, use_bias=True)


class EncoderDecoder(nn.Module):
    """T5: encoder over inputs, decoder over shifted targets with cross-attention."""

    cfg: object
    plan: object  # plan.ModelPlan

    def setup(self):
        self.token_embedder = self.plan.token_embedder()
        self.decoder = Stack(self.plan.decoder, self.token_embedder)
        # model.tie_encoder_decoder_embeddings=False: the encoder reads its own embedding
        self.encoder_token_embedder = (None if self.cfg.tie_encoder_decoder_embeddings
                                       else self.plan.token_embedder())
        self.encoder = Stack(self.plan.encoder, self.encoder_token_embedder or self.token_embedder,
                             shared=self.decoder if self.cfg.shared_encoder_decoder else None)

    def __call__(self, batch, deterministic=True):
        encoded_BSD = self.encode(batch["encoder_input_tokens"], batch.get("encoder_segment_ids"),
                                  batch.get("encoder_positions"), deterministic)
        logits_BLV = self.decode(batch["decoder_input_tokens"], encoded_BSD,
                                 batch["encoder_input_tokens"], batch.get("decoder_positions"),
                                 batch.get("decoder_segment_ids"),
                                 batch.get("encoder_segment_ids"), deterministic=deterministic)
        return {"logits": logits_BLV}

    def encode(self, encoder_input_tokens, encoder_segment_ids=None, encoder_positions=None,
               deterministic=True):
        return self.encoder(encoder_input_tokens, encoder_positions, encoder_segment_ids,
                            deterministic=deterministic)

    def decode(self, decoder_input_tokens, encoded, encoder_input_tokens, decoder_positions=None,
               decoder_segment_ids=None, encoder_segment_ids=None, decode=False,
               deterministic=True):
        # a Funnel encoder's output is shorter than its ids: the cross mask reads pooled ids
        encoder_input_tokens, encoder_segment_ids = funnel.pool_ids(
            self.cfg, encoder_input_tokens, encoder_segment_ids)
        x_BLD = self.decoder(decoder_input_tokens, decoder_positions, decoder_segment_ids,
                             encoded_BSD=encoded, encoder_tokens_BS=encoder_input_tokens,
                             encoder_segments_BS=encoder_segment_ids,
                             deterministic=deterministic, decode=decode)
        return self.decoder.logits(x_BLD)


class DecoderOnly(nn.Module):
    """GPT-style LM; architecture="prefix_lm" makes the decoder_causal_attention part
    bidirectional. num_classes > 0 adds a classifier on the last non-padding token."""

    cfg: object
    plan: object  # plan.ModelPlan

    def setup(self):
        self.token_embedder = self.plan.token_embedder()
        self.decoder = Stack(self.plan.decoder, self.token_embedder)
        if self.cfg.num_classes > 0:
            self.class_dense = head_dense(self.cfg, self.cfg.num_classes, ("embed", "classes"))

    def __call__(self, batch, deterministic=True):
        tokens_BL = batch["decoder_input_tokens"]
        segments_BL = batch.get("decoder_segment_ids")
        x_BLD = self.decoder(tokens_BL, batch.get("decoder_positions"), segments_BL,
                             prefix_BL=batch.get("decoder_causal_attention"),
                             deterministic=deterministic)
        out = {"logits": self.decoder.logits(x_BLD)}
        if self.cfg.num_classes > 0:
            if segments_BL is not None:
                real_BL = segments_BL != 0
            elif "decoder_target_tokens" in batch:
                real_BL = batch["decoder_target_tokens"] != 0
            else:
                real_BL = jnp.ones(tokens_BL.shape, bool)
            last_B = jnp.maximum(jnp.sum(real_BL, axis=1) - 1, 0)
            x_BD = jnp.take_along_axis(x_BLD, last_B[:, None, None], axis=1)[:, 0]
            out["class_logits"] = self.class_dense(x_BD).astype(jnp.float32)
        return out

    def decode(self, decoder_input_tokens, encoded=None, encoder_input_tokens=None,
               decoder_positions=None, decoder_segment_ids=None, encoder_segment_ids=None,
               decode=False, deterministic=True, decoder_causal_attention=None):
        """Same call as EncoderDecoder.decode (encoded / encoder_* are unused here);
        decoder_causal_attention marks a prefix-LM prompt chunk as bidirectional."""
        x_BLD = self.decoder(decoder_input_tokens, decoder_positions, decoder_segment_ids,
                             prefix_BL=decoder_causal_attention, deterministic=deterministic,
                             decode=decode)
        return self.decoder.logits(x_BLD)


class EncoderOnly(nn.Module):
    """BERT: bidirectional encoder with MLM head (always), pooler / NSP / classifier heads."""

    cfg: object
    plan: object  # plan.ModelPlan

    def setup(self):
        cfg = self.cfg
        self.token_embedder = self.plan.token_embedder()
        self.encoder = Stack(self.plan.encoder, self.token_embedder)
        self.mlm_dense = head_dense(cfg, cfg.embed_dim or cfg.d_model, ("embed", "mlp"))
        self.mlm_norm = L.make_norm(cfg)
        self.mlm_bias = self.param("mlm_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, ("vocab",)), (cfg.vocab_size,), jnp.float32)
        if not cfg.tie_embeddings:
            self.logits_dense = L.make_dense(cfg, cfg.vocab_size, ("embed", "vocab"), False)
        if cfg.pooler or cfg.nsp_head:
            self.pooler = head_dense(cfg, cfg.d_model, ("mlp", "embed"))
        if cfg.nsp_head:
            self.nsp_dense = head_dense(cfg, 2, ("embed", "classes"))
        if cfg.num_classes > 0:
            self.class_dense = head_dense(cfg, cfg.num_classes, ("embed", "classes"))
        if cfg.num_token_classes > 0:
            self.token_dense = head_dense(cfg, cfg.num_token_classes, ("embed", "classes"))
        if cfg.span_head:
            self.span_dense = head_dense(cfg, 2, ("embed", "classes"))
        if cfg.sbo_head:
            self.sbo = SpanBoundaryHead(cfg)
        self.head_dropout = nn.Dropout(cfg.dropout_rate)

    def __call__(self, batch, deterministic=True):
        cfg = self.cfg
        x_BLD = self.encoder(batch["encoder_input_tokens"], batch.get("encoder_positions"),
                             batch.get("encoder_segment_ids"), batch.get("encoder_token_type_ids"),
                             deterministic=deterministic)
        out = {}
        m_BLD, pos_BK = x_BLD, None
        if cfg.mlm_predict_fraction and "encoder_loss_weights" in batch:
            k = math.ceil(cfg.mlm_predict_fraction * x_BLD.shape[1])
            pos_BK = mlm_positions(batch["encoder_loss_weights"], k)
            m_BLD = jnp.take_along_axis(x_BLD, pos_BK[..., None], axis=1)  # [B, K, D]
            out["logits_positions"] = pos_BK
        out["logits"] = self._vocab_logits(
            self.mlm_norm(L.ACTIVATIONS[cfg.ffn](self.mlm_dense(m_BLD))))
        if cfg.sbo_head and "encoder_span_offset" in batch:  # SpanBERT: at the MLM positions
            spans = [batch[f"encoder_span_{k}"] for k in ("left", "right", "offset")]
            if pos_BK is not None:
                spans = [jnp.take_along_axis(s, pos_BK, axis=1) for s in spans]
            out["sbo_logits"] = self._vocab_logits(self.sbo(x_BLD, *spans))
        cls_BD = x_BLD[:, 0]
        if cfg.pooler or cfg.nsp_head:
            cls_BD = jnp.tanh(self.pooler(cls_BD))
        if cfg.nsp_head:
            out["nsp_logits"] = self.nsp_dense(cls_BD).astype(jnp.float32)
        if cfg.num_classes > 0:
            cls_BD = self.head_dropout(cls_BD, deterministic=deterministic)
            out["class_logits"] = self.class_dense(cls_BD).astype(jnp.float32)
        if cfg.num_token_classes > 0 or cfg.span_head:
            h_BLD = self.head_dropout(x_BLD, deterministic=deterministic)
        if cfg.num_token_classes > 0:  # tagging (labels on first sub-tokens: see losses.py)
            out["token_logits"] = self.token_dense(h_BLD).astype(jnp.float32)
        if cfg.span_head:  # QA: start / end of the answer span; padding can never be chosen
            valid_BL = (batch["encoder_input_tokens"] != 0)[..., None]
            span_BL2 = jnp.where(valid_BL, self.span_dense(h_BLD).astype(jnp.float32), L.NEG_INF)
            out["start_logits"], out["end_logits"] = span_BL2[..., 0], span_BL2[..., 1]
        return out

    def _vocab_logits(self, h_BLD):
        """The MLM output layer (tied embeddings or logits_dense, + mlm_bias), float32."""
        if self.cfg.tie_embeddings:
            logits_BLV = self.token_embedder.attend(h_BLD)
        else:
            logits_BLV = self.logits_dense(h_BLD)
        return L.constrain(logits_BLV.astype(jnp.float32) + self.mlm_bias,
                           ("batch", "length", "vocab"))


def mlm_positions(weights_BL, k: int):
    """[B, k] indices of the first k positions per row with a nonzero weight, in order; rows
    with fewer are filled with weight-0 positions (their logits are computed, never scored)."""
    length = weights_BL.shape[1]
    k = min(k, length)
    score_BL = jnp.where(weights_BL > 0, length - jnp.arange(length, dtype=jnp.int32), 0)
    return jax.lax.top_k(score_BL, k)[1].astype(jnp.int32)


ARCHITECTURES = {
    "encoder_decoder": EncoderDecoder,
    "decoder_only": DecoderOnly,
    "prefix_lm": DecoderOnly,
    "encoder_only": EncoderOnly,
}
