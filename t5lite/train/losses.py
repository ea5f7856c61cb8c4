"""Losses: token cross entropy (z-loss, label smoothing, T5 normalisation), BERT MLM + NSP,
finetuning heads (sequence classification, token tagging, QA spans), and GPT-1's auxiliary LM
loss for decoder-only classification (L = L_task + train.aux_lm_weight * L_LM).

Every term is a *sum* divided by a normaliser computed from the whole (global) batch. With
gradient accumulation the train step computes the normalisers once for the full batch and passes
them to each micro-batch, so the sum over micro-batches is exactly the big-batch loss.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import optax

from t5lite.models import electra


def cross_entropy_with_logits(logits, targets, label_smoothing=0.0, z_loss=0.0):
    """Per-token cross entropy (T5X semantics) and z-loss, both float32 with the targets' shape.

    Label smoothing puts `label_smoothing` mass uniformly on the other V-1 classes and subtracts
    the entropy of that soft target, so a perfect prediction has loss 0. The z-loss
    z_loss * log(Z)^2 keeps the softmax normaliser near 1 (PaLM / T5X).
    The gradient is hand-written (as T5X's): one fused pass over [..., V] instead of autodiff's
    chain of [..., V] temporaries, which dominates a CPU train step with a large vocabulary.
    """
    return _xent(logits.astype(jnp.float32), targets, float(label_smoothing), float(z_loss))


def _soft_target_weights(vocab, label_smoothing):
    """(weight of the label, weight of every other class, entropy of the soft target)."""
    if label_smoothing <= 0.0:
        return 1.0, 0.0, 0.0
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    entropy = -(confidence * math.log(confidence) + (vocab - 1) * low * math.log(low + 1e-20))
    return confidence, low, entropy


def _xent_fwd(logits, targets, label_smoothing, z_loss):
    vocab = logits.shape[-1]
    hi, low, entropy = _soft_target_weights(vocab, label_smoothing)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    # sum(soft * logits) with soft = low + (hi - low) * one_hot(targets); sum(soft) = 1
    label_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    soft_logit = (hi - low) * label_logit
    if low:
        soft_logit = soft_logit + low * jnp.sum(logits, axis=-1)
    ce = log_z - soft_logit - entropy
    return (ce, z_loss * jnp.square(log_z)), (logits, targets, log_z)


def _xent_bwd(label_smoothing, z_loss, res, g):
    """d/dlogits = softmax * (g_ce + 2 z log_z g_z) - soft_target * g_ce."""
    logits, targets, log_z = res
    g_ce, g_z = g
    hi, low, _ = _soft_target_weights(logits.shape[-1], label_smoothing)
    labels = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == targets[
        ..., None]
    soft = jnp.where(labels, hi, low)
    p_scale = (g_ce + 2.0 * z_loss * log_z * g_z)[..., None]
    d_logits = jnp.exp(logits - log_z[..., None]) * p_scale - soft * g_ce[..., None]
    return d_logits, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _xent(logits, targets, label_smoothing, z_loss):
    return _xent_fwd(logits, targets, label_smoothing, z_loss)[0]


_xent.defvjp(_xent_fwd, _xent_bwd)


def _is_top1(logits, targets):
    """argmax(logits) == targets, written as "the target's logit is the maximum" (a tie counts
    as correct). The same form on every backend, so accuracy means one thing everywhere; it is
    written this way because a plain max-reduce is cheap everywhere, where XLA:CPU runs the
    (value, index) reduce of argmax over a vocabulary far slower (bench/RESULTS.md)."""
    label = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return label >= jnp.max(logits, axis=-1)


def _token_keys(batch):
    if "decoder_target_tokens" in batch:
        return "decoder_target_tokens", "decoder_loss_weights"
    if "encoder_target_tokens" in batch:
        return "encoder_target_tokens", "encoder_loss_weights"
    return None, None


def normalizers(cfg, batch) -> dict:
    """Denominators of each loss term, from the *full* batch (independent of the parameters)."""
    out = {}
    _, w_key = _token_keys(batch)
    if w_key is not None:
        real = jnp.sum(batch[w_key].astype(jnp.float32))
        out["tokens"] = jnp.maximum(real, 1.0)
        # T5: a constant factor (e.g. 233472 = 2048 * 114) instead of the real-token count.
        out["loss"] = (jnp.float32(cfg.train.loss_normalizing_factor)
                       if cfg.train.loss_normalizing_factor else out["tokens"])
    out["examples"] = jnp.float32(next(iter(batch.values())).shape[0])  # NSP / classification
    if "token_labels" in batch:  # tagging: labelled (first sub-)tokens
        out["tagged"] = jnp.maximum(jnp.sum(_tag_weights(batch)), 1.0)
    if cfg.model.electra.rtd_head and "encoder_input_tokens" in batch:  # ELECTRA's RTD term
        out["real_tokens"] = jnp.maximum(jnp.sum(electra.real_tokens(batch)), 1.0)
    if _wants_aux_lm(cfg, batch):
        out["lm_tokens"] = jnp.maximum(jnp.sum(_aux_lm_weights(batch)), 1.0)
    return out


def _wants_aux_lm(cfg, batch) -> bool:
    return (cfg.train.aux_lm_weight > 0 and "class_labels" in batch
            and "decoder_input_tokens" in batch)


def _aux_lm_weights(batch):
    """[B, L-1]: 1 where token t+1 is a real token of the same segment as token t (the
    classification batch's text is unshifted; segment id 0 is padding)."""
    tokens_BL = batch["decoder_input_tokens"]
    seg_BL = batch.get("decoder_segment_ids")
    if seg_BL is None:
        seg_BL = jnp.ones(tokens_BL.shape, jnp.int32)
    return ((seg_BL[:, 1:] != 0) & (seg_BL[:, 1:] == seg_BL[:, :-1])).astype(jnp.float32)


def aux_lm_loss(outputs: dict, batch: dict, norm):
    """GPT-1's auxiliary LM term: mean next-token cross entropy of the LM logits over the
    classification inputs (logits at t predict decoder_input_tokens at t + 1)."""
    w_BL = _aux_lm_weights(batch)
    ce_BL, _ = cross_entropy_with_logits(outputs["logits"][:, :-1],
                                         batch["decoder_input_tokens"][:, 1:])
    return jnp.sum(ce_BL * w_BL) / norm


HEAD_OUTPUTS = ("class_logits", "token_logits", "start_logits")


def _tag_weights(batch):
    """token_label_weights (1 on the first sub-token of each word), else every real token."""
    if "token_label_weights" in batch:
        return batch["token_label_weights"].astype(jnp.float32)
    return (batch["encoder_input_tokens"] != 0).astype(jnp.float32)


def head_losses(cfg, outputs: dict, batch: dict, norms: dict):
    """Finetuning heads (summed when several are present) -> (loss, metrics):
    class_logits [B, C] vs class_labels [B]; token_logits [B, L, C] vs token_labels [B, L]
    weighted by token_label_weights; start/end_logits [B, L] vs start/end_positions [B]."""
    loss, metrics = 0.0, {}
    ex = norms["examples"]
    if "class_logits" in outputs:
        ce, _ = cross_entropy_with_logits(outputs["class_logits"], batch["class_labels"],
                                          cfg.train.label_smoothing)
        correct = jnp.argmax(outputs["class_logits"], -1) == batch["class_labels"]
        metrics["class_loss"] = jnp.sum(ce) / ex
        metrics["accuracy"] = jnp.sum(correct) / ex
        loss = loss + metrics["class_loss"]
        if "lm_tokens" in norms and "logits" in outputs:  # GPT-1: + lambda * L_LM
            metrics["lm_loss"] = aux_lm_loss(outputs, batch, norms["lm_tokens"])
            loss = loss + cfg.train.aux_lm_weight * metrics["lm_loss"]
    if "token_logits" in outputs:
        w = _tag_weights(batch)
        labels = batch["token_labels"]
        ce, _ = cross_entropy_with_logits(outputs["token_logits"], labels,
                                          cfg.train.label_smoothing)
        correct = (jnp.argmax(outputs["token_logits"], -1) == labels).astype(jnp.float32) * w
        metrics["token_loss"] = jnp.sum(ce * w) / norms["tagged"]
        metrics["token_accuracy"] = jnp.sum(correct) / norms["tagged"]
        loss = loss + metrics["token_loss"]
    if "start_logits" in outputs:
        s_ce, _ = cross_entropy_with_logits(outputs["start_logits"], batch["start_positions"])
        e_ce, _ = cross_entropy_with_logits(outputs["end_logits"], batch["end_positions"])
        exact = ((jnp.argmax(outputs["start_logits"], -1) == batch["start_positions"])
                 & (jnp.argmax(outputs["end_logits"], -1) == batch["end_positions"]))
        metrics["span_loss"] = jnp.sum(s_ce + e_ce) / (2.0 * ex)
        metrics["span_exact"] = jnp.sum(exact) / ex
        loss = loss + metrics["span_loss"]
    metrics["loss"] = loss
    return loss, metrics


def compute_loss(cfg, outputs: dict, batch: dict, norms: dict | None = None):
    """-> (scalar loss, metrics). Metrics are already divided by the batch normalisers, so they
    add up over micro-batches.

    - a finetuning head's outputs present ("class_logits", "token_logits", "start_logits"):
      those heads' losses only (head_losses).
    - otherwise token cross entropy over the target tokens (LM / T5 / BERT MLM), plus the NSP
      loss when "nsp_logits" is present (BERT pretraining) and the SBO loss (same targets and
      weights) when "sbo_logits" is (SpanBERT).
    """
    if norms is None:
        norms = normalizers(cfg, batch)
    if "aux_loss" in outputs:  # mixture-of-experts layers' load-balancing loss
        return _with_aux_loss(cfg, outputs, batch, norms)
    metrics = {}
    if any(k in outputs for k in HEAD_OUTPUTS):
        return head_losses(cfg, outputs, batch, norms)
    if "rtd_logits" in outputs:
        return electra_loss(cfg, outputs, batch, norms)

    t_key, w_key = _token_keys(batch)
    if t_key is None:
        raise ValueError("batch has no decoder_/encoder_target_tokens and outputs no class_logits")
    targets, weights = batch[t_key], batch[w_key].astype(jnp.float32)
    if "logits_positions" in outputs:  # BERT MLM head on gathered positions only
        all_weights = weights
        targets, weights = (jnp.take_along_axis(x, outputs["logits_positions"], axis=1)
                            for x in (targets, weights))
        dropped = jnp.sum(all_weights) - jnp.sum(weights)
        metrics["mlm_dropped_fraction"] = dropped / norms["tokens"]
    ce, zl = cross_entropy_with_logits(outputs["logits"], targets, cfg.train.label_smoothing,
                                       cfg.train.z_loss)
    ce_sum, z_sum = jnp.sum(ce * weights), jnp.sum(zl * weights)
    loss = (ce_sum + z_sum) / norms["loss"]
    correct = _is_top1(outputs["logits"], targets).astype(jnp.float32) * weights
    metrics["cross_entropy"] = ce_sum / norms["tokens"]  # per real token, whatever the factor
    metrics["z_loss"] = z_sum / norms["tokens"]
    metrics["accuracy"] = jnp.sum(correct) / norms["tokens"]
    metrics["num_tokens"] = jnp.sum(weights)

    if "sbo_logits" in outputs:  # SpanBERT: loss = MLM + SBO, both over the masked tokens
        sbo_ce, _ = cross_entropy_with_logits(outputs["sbo_logits"], targets,
                                              cfg.train.label_smoothing)
        metrics["mlm_loss"] = loss
        metrics["sbo_loss"] = jnp.sum(sbo_ce * weights) / norms["loss"]
        metrics["sbo_accuracy"] = jnp.sum(_is_top1(outputs["sbo_logits"], targets)
                                          * weights) / norms["tokens"]
        loss = loss + metrics["sbo_loss"]
    if "nsp_logits" in outputs:
        nsp_ce, _ = cross_entropy_with_logits(outputs["nsp_logits"], batch["nsp_labels"])
        nsp = jnp.sum(nsp_ce) / norms["examples"]
        metrics.setdefault("mlm_loss", loss)
        metrics["nsp_loss"] = nsp
        metrics["nsp_accuracy"] = jnp.sum(
            jnp.argmax(outputs["nsp_logits"], -1) == batch["nsp_labels"]) / norms["examples"]
        loss = loss + nsp
    metrics["loss"] = loss
    return loss, metrics


def _with_aux_loss(cfg, outputs: dict, batch: dict, norms: dict):
    """compute_loss of the other outputs + outputs["aux_loss"] (metric "moe_aux_loss"). The
    layers average it over this (micro-)batch's sequences; weighting it by the (micro-)batch's
    share of the full batch makes the micro-batches' sum the full batch's mean."""
    loss, metrics = compute_loss(cfg, {k: v for k, v in outputs.items() if k != "aux_loss"},
                                 batch, norms)
    aux = outputs["aux_loss"] * (next(iter(batch.values())).shape[0] / norms["examples"])
    return loss + aux, dict(metrics, moe_aux_loss=aux, loss=loss + aux)


def electra_loss(cfg, outputs: dict, batch: dict, norms: dict):
    """ELECTRA: the generator's MLM loss (compute_loss on its ``logits``) + model.electra.
    rtd_weight * the discriminator's binary cross entropy, averaged over real tokens."""
    loss, metrics = 0.0, {}
    if "logits" in outputs:  # the generator ran (pretraining batch with masked positions)
        loss, metrics = compute_loss(
            cfg, {k: v for k, v in outputs.items() if not k.startswith("rtd_")}, batch, norms)
        metrics["mlm_loss"] = loss
    w_BL = outputs["rtd_weights"]
    labels_BL = outputs["rtd_labels"].astype(jnp.float32)
    bce_BL = optax.sigmoid_binary_cross_entropy(outputs["rtd_logits"], labels_BL)
    n = norms["real_tokens"]
    metrics["rtd_loss"] = jnp.sum(bce_BL * w_BL) / n
    metrics["rtd_accuracy"] = jnp.sum(((outputs["rtd_logits"] > 0) == (labels_BL > 0)) * w_BL) / n
    metrics["replaced_fraction"] = jnp.sum(labels_BL * w_BL) / n
    loss = loss + cfg.model.electra.rtd_weight * metrics["rtd_loss"]
    metrics["loss"] = loss
    return loss, metrics
