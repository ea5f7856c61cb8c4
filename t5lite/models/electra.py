"""ELECTRA (Clark et al. 2020): replaced-token detection on the BERT encoder.

A small generator (a BERT MLM: its own encoder Stack, sharing the discriminator's token,
position and token-type embeddings and their norm) predicts the masked positions of a
``bert_mlm`` batch; a token sampled from its softmax replaces each masked input (integer ids:
nothing flows back through the sample). The discriminator (the BERT encoder) then labels every
real token as original (0) or replaced (1); a sampled token that happens to equal the original
counts as original. Loss = MLM(generator) + model.electra.rtd_weight * RTD (losses.py).

Parameter tree (encoder_only layout of architectures.py, no pooler / NSP / MLM head)::

    token_embedder/embedding                    [V, E]  (E = embed_dim or d_model; shared)
    encoder/{position_embedder, token_type_embedder, embed_norm}   (E wide; shared)
    encoder/embed_project/{kernel [E, D], bias}  (E != D: HF embeddings_project)
    encoder/layers/...                          (BERT layers)
    rtd_dense/{kernel [D, D], bias}, rtd_logits/{kernel [D, 1], bias}
                                                (HF ElectraDiscriminatorPredictions)
    generator/embed_project, generator/layers/...   (generator_d_model wide; pretraining)
    generator_mlm_dense/{kernel [Dg, E], bias}, generator_mlm_norm/{scale, bias},
    generator_mlm_bias [V]                      (HF ElectraGeneratorPredictions + tied LM head)
    class_dense/{kernel [D, C], bias}           (num_classes > 0: finetuning on [CLS]; then
                                                 neither the generator nor the RTD head exist)

Outputs: ``rtd_logits`` [B, L] float32 (HF ElectraForPreTraining's logits), ``rtd_labels``
[B, L] int32 (1 = replaced), ``rtd_weights`` [B, L] (1 on real tokens); with the generator and
``encoder_loss_weights`` in the batch also its MLM ``logits`` (+ ``logits_positions``) as
EncoderOnly gives them, and ``corrupted_tokens`` [B, L] (the discriminator's input).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import layers as L
from t5lite.models.architectures import head_dense, mlm_positions
from t5lite.models.transformer import Stack


# left out by count_params(heads=False): the discriminator alone is HF's ElectraModel
HEAD_PREFIXES = ("rtd_", "generator")


def generator_config(cfg):
    """The generator's ModelConfig: the discriminator's with the generator's widths. The paper
    (Table 6) scales hidden size, FFN size and heads by 1/4 (Small, Large) or 1/3 (Base)."""
    electra = cfg.electra
    width = electra.generator_d_model
    heads = electra.generator_num_heads or max(1, width // cfg.head_dim)
    d_ff = electra.generator_d_ff or max(1, cfg.d_ff * width // cfg.d_model)
    return dataclasses.replace(
        cfg, d_model=width, d_ff=d_ff, num_heads=heads, head_dim=width // heads,
        num_encoder_layers=electra.generator_layers or cfg.num_encoder_layers,
        embed_dim=cfg.embed_dim or cfg.d_model, num_classes=0,
        electra=dataclasses.replace(electra, generator_d_model=0))


def real_tokens(batch):
    """[B, L] float32: 1 on real (non-padding) tokens; segment id 0 (else token 0) is padding."""
    seg_BL = batch.get("encoder_segment_ids")
    if seg_BL is None:
        seg_BL = batch["encoder_input_tokens"]
    return (seg_BL != 0).astype(jnp.float32)


def replace_tokens(tokens_BL, positions_BN, sampled_BN, weights_BN):
    """tokens with sampled_BN written at positions_BN where weights_BN > 0 (filler positions
    of mlm_positions keep their token)."""
    rows_B1 = jnp.arange(tokens_BL.shape[0])[:, None]
    keep_BN = jnp.take_along_axis(tokens_BL, positions_BN, axis=1)
    new_BN = jnp.where(weights_BN > 0, sampled_BN.astype(tokens_BL.dtype), keep_BN)
    return jnp.asarray(tokens_BL).at[rows_B1, positions_BN].set(new_BN)


class Electra(nn.Module):
    """Generator + discriminator (pretraining) or the discriminator alone (finetuning / HF)."""

    cfg: object
    plan: object  # plan.ModelPlan: encoder and (pretraining) generator stacks

    def setup(self):
        cfg = self.cfg
        self.token_embedder = self.plan.token_embedder()
        self.encoder = Stack(self.plan.encoder, self.token_embedder)
        if cfg.num_classes > 0:
            self.class_dense = head_dense(cfg, cfg.num_classes, ("embed", "classes"))
            self.head_dropout = nn.Dropout(cfg.dropout_rate)
            return
        self.rtd_dense = head_dense(cfg, cfg.d_model, ("embed", "mlp"))
        self.rtd_logits = head_dense(cfg, 1, ("mlp", "classes"))
        if cfg.electra.generator_d_model:
            generator = self.plan.generator.cfg
            self.generator = Stack(self.plan.generator, self.token_embedder,
                                   embeddings_from=self.encoder)
            self.generator_mlm_dense = head_dense(generator, generator.embed_dim,
                                                  ("mlp", "embed"))
            self.generator_mlm_norm = L.make_norm(cfg)
            self.generator_mlm_bias = self.param("generator_mlm_bias", nn.with_logical_partitioning(
                nn.initializers.zeros, ("vocab",)), (cfg.vocab_size,), jnp.float32)

    def __call__(self, batch, deterministic=True):
        cfg = self.cfg
        tokens_BL = batch["encoder_input_tokens"]
        args = (batch.get("encoder_positions"), batch.get("encoder_segment_ids"),
                batch.get("encoder_token_type_ids"))
        out = {}
        if cfg.num_classes > 0:  # finetuning: BERT's classifier on the discriminator's [CLS]
            x_BLD = self.encoder(tokens_BL, *args, deterministic=deterministic)
            cls_BD = self.head_dropout(x_BLD[:, 0], deterministic=deterministic)
            return {"class_logits": self.class_dense(cls_BD).astype(jnp.float32)}
        labels_BL = jnp.zeros(tokens_BL.shape, jnp.int32)
        if cfg.electra.generator_d_model and "encoder_loss_weights" in batch:
            out.update(self.generate(batch, args, deterministic))
            tokens_BL = out["corrupted_tokens"]
            labels_BL = (tokens_BL != batch["encoder_target_tokens"]).astype(jnp.int32)
        x_BLD = self.encoder(tokens_BL, *args, deterministic=deterministic)
        h_BLD = L.ACTIVATIONS[cfg.ffn](self.rtd_dense(x_BLD))
        out["rtd_logits"] = self.rtd_logits(h_BLD)[..., 0].astype(jnp.float32)
        out["rtd_weights"] = real_tokens(batch)
        out["rtd_labels"] = labels_BL * out["rtd_weights"].astype(jnp.int32)
        return out

    def generate(self, batch, args, deterministic):
        """Generator MLM logits at the masked positions and the inputs with samples there."""
        cfg = self.cfg
        tokens_BL, w_BL = batch["encoder_input_tokens"], batch["encoder_loss_weights"]
        x_BLD = self.generator(tokens_BL, *args, deterministic=deterministic)
        length = x_BLD.shape[1]
        if cfg.mlm_predict_fraction:  # logits at the masked positions only, as EncoderOnly
            pos_BK = mlm_positions(w_BL, math.ceil(cfg.mlm_predict_fraction * length))
        else:
            pos_BK = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), w_BL.shape)
        m_BKD = jnp.take_along_axis(x_BLD, pos_BK[..., None], axis=1)
        # HF ElectraGeneratorPredictions: dense -> gelu (always) -> LayerNorm; tied LM head
        h_BKE = self.generator_mlm_norm(jax.nn.gelu(self.generator_mlm_dense(m_BKD),
                                                    approximate=False))
        logits_BKV = (self.token_embedder.attend(h_BKE).astype(jnp.float32)
                      + self.generator_mlm_bias)
        # sampling rng: the dropout stream when training; a fixed key in deterministic eval
        key = self.make_rng("dropout") if not deterministic else jax.random.key(0)
        sampled_BK = jax.random.categorical(key, jax.lax.stop_gradient(logits_BKV))
        w_BK = jnp.take_along_axis(w_BL, pos_BK, axis=1)
        out = {"logits": L.constrain(logits_BKV, ("batch", "length", "vocab")),
               "corrupted_tokens": replace_tokens(tokens_BL, pos_BK, sampled_BK, w_BK)}
        if cfg.mlm_predict_fraction:
            out["logits_positions"] = pos_BK
        return out
