"""Token embeddings whose output layer is not one tied softmax: adaptive input embeddings
(Baevski & Auli 2019), the adaptive softmax (Grave et al. 2017) and a mixture of softmaxes
(Yang et al. 2018), as the Narang et al. 2021 reference configured them.

Each takes the token embedder's place (``__call__(ids)``, shared by encoder and decoder as T5
shares its embedding) and gives the decoder's output through ``vocab_logits(x)``. The adaptive
softmax and the mixture return log-probabilities normalised over the whole vocabulary: the
loss's softmax cross entropy of normalised log-probabilities is their negative log-likelihood
(its log-partition is 0, so the z-loss adds nothing), and decoding's argmax / sampling read
them as logits. Computing every token's log-probability costs the same matmuls as the
reference's training loss when its tail clusters keep every position; that reference's
capacity-limited tails (length_projection_factor) are a speed-up this leaves out.

Clusters (``model.vocab_clusters``): ((token_count, embedding_size), ...) over consecutive
ids, the most frequent first; embedding_size 0 = d_model. A cluster narrower than d_model is
factorised: its [n, e] table and an [e, D] ``projection`` (both ways: input and output).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.config.mixing_rules import parse_clusters
from t5lite.models import layers as L
from t5lite.models.registry import OutputLayer

VOCAB_LAYERS = ("adaptive_input", "adaptive_softmax", "mixture_of_softmaxes")


def vocab_layer_kind(cfg) -> str:
    """Which of VOCAB_LAYERS the model's embedding is, or "" for the plain Embed."""
    if cfg.output_softmax == "adaptive":
        return "adaptive_softmax"
    if cfg.output_softmax == "mixture":
        return "mixture_of_softmaxes"
    return "adaptive_input" if cfg.adaptive_input else ""


def cluster_sizes(cfg) -> list[tuple[int, int]]:
    """(token_count, embedding width) per cluster, width 0 resolved to d_model."""
    return [(n, e or cfg.d_model) for n, e in parse_clusters(cfg.vocab_clusters)]


class Cluster(nn.Module):
    """One cluster's table [rows, e] and, when e < d_model, its [e, D] projection."""

    cfg: object
    rows: int
    width: int

    def setup(self):
        cfg = self.cfg
        factorised = self.width != cfg.d_model
        # factorised: both factors N(0, e^-1/2) so an embedding has unit variance, as a full
        # N(0, 1) table (the reference's factorised initialisation)
        init = nn.initializers.normal(self.width ** -0.25) if factorised else L.embed_init(cfg)
        self.embedding = self.param("embedding", nn.with_logical_partitioning(
            init, ("vocab", "embed")), (self.rows, self.width), jnp.float32)
        if factorised:
            self.projection = self.param("projection", nn.with_logical_partitioning(
                init, (None, "embed")), (self.width, cfg.d_model), jnp.float32)

    def embed(self, local_BL, count: int):
        """Embeddings of cluster-local ids; zero for ids outside [0, count)."""
        dtype = L.compute_dtype(self.cfg)
        inside_BL = (local_BL >= 0) & (local_BL < count)
        e_BLE = jnp.take(self.embedding, jnp.clip(local_BL, 0, count - 1), axis=0).astype(dtype)
        if self.width != self.cfg.d_model:
            e_BLE = e_BLE @ self.projection.astype(dtype)
        return e_BLE * inside_BL[..., None].astype(dtype)

    def logits(self, h_BLD):
        """Float32 logits of the cluster's rows for the (rescaled) decoder output."""
        dtype = L.compute_dtype(self.cfg)
        if self.width != self.cfg.d_model:
            h_BLD = h_BLD @ self.projection.astype(dtype).T
        return (h_BLD @ self.embedding.astype(dtype).T).astype(jnp.float32)


class AdaptiveEmbed(nn.Module):
    """Adaptive input embeddings; with ``softmax`` the adaptive softmax too: the head cluster
    holds one extra row per tail cluster, p(token) = p(its cluster | head) p(token | cluster)."""

    cfg: object
    softmax: bool = False

    def setup(self):
        sizes = cluster_sizes(self.cfg)
        tails = len(sizes) - 1 if self.softmax else 0
        self.clusters = [Cluster(self.cfg, n + (tails if i == 0 else 0), e, name=f"cluster_{i}")
                         for i, (n, e) in enumerate(sizes)]

    def __call__(self, ids_BL):
        out_BLD, start = 0.0, 0
        for cluster, (n, _) in zip(self.clusters, cluster_sizes(self.cfg)):
            out_BLD = out_BLD + cluster.embed(ids_BL - start, n)
            start += n
        return out_BLD

    def vocab_logits(self, x_BLD):
        """[B, L, V] float32: concatenated cluster logits, or the adaptive softmax's
        log-probabilities over the whole vocabulary."""
        h_BLD = _rescaled(self.cfg, x_BLD)
        parts = [cluster.logits(h_BLD) for cluster in self.clusters]
        if not self.softmax:
            return jnp.concatenate(parts, axis=-1)
        head_count = cluster_sizes(self.cfg)[0][0]
        head_BLX = jax.nn.log_softmax(parts[0], axis=-1)
        out = [head_BLX[..., :head_count]]
        for i, tail_BLN in enumerate(parts[1:]):
            out.append(head_BLX[..., head_count + i, None] + jax.nn.log_softmax(tail_BLN, -1))
        return jnp.concatenate(out, axis=-1)


class MixtureOfSoftmaxes(nn.Module):
    """A plain tied embedding; the output is log sum_k pi_k(h) softmax(tanh(C_k h) . E^T) with
    ``model.mos_components`` components (prior weights ``mixture``, contexts ``context``)."""

    cfg: object

    def setup(self):
        cfg = self.cfg
        k, d = cfg.mos_components, cfg.d_model
        self.embed = L.make_embed(cfg, cfg.vocab_size, d, ("vocab", "embed"))
        self.mixture = self.param("mixture", nn.with_logical_partitioning(
            L.embed_init(cfg), (None, "embed")), (k, d), jnp.float32)
        self.context = self.param("context", nn.with_logical_partitioning(
            L.embed_init(cfg), (None, "embed", "mlp")), (k, d, d), jnp.float32)

    def __call__(self, ids_BL):
        return self.embed(ids_BL)

    def vocab_logits(self, x_BLD):
        dtype = L.compute_dtype(self.cfg)
        h_BLD = _rescaled(self.cfg, x_BLD)
        prior_BLK = jax.nn.log_softmax(
            (h_BLD @ self.mixture.astype(dtype).T).astype(jnp.float32), axis=-1)
        ctx_BLKD = jnp.tanh(jnp.einsum("bld,kdc->blkc", h_BLD, self.context.astype(dtype)))
        comp_BLKV = jax.nn.log_softmax(self.embed.attend(ctx_BLKD).astype(jnp.float32), -1)
        return jax.nn.logsumexp(prior_BLK[..., None] + comp_BLKV, axis=-2)


def _rescaled(cfg, x_BLD):
    """The decoder output as a tied output layer reads it (T5 v1.0: times d_model**-0.5)."""
    if cfg.scale_tied_logits:
        x_BLD = x_BLD * jnp.asarray(cfg.d_model ** -0.5, x_BLD.dtype)
    return x_BLD.astype(L.compute_dtype(cfg))


def make_vocab_layer(cfg):
    """The token embedder for ``cfg`` when vocab_layer_kind(cfg) is set."""
    kind = vocab_layer_kind(cfg)
    if kind == "mixture_of_softmaxes":
        return MixtureOfSoftmaxes(cfg)
    return AdaptiveEmbed(cfg, softmax=kind == "adaptive_softmax")


# the decoder's output layer when the token embedder is one of VOCAB_LAYERS (models/plan.py)
VOCAB_LOGITS = OutputLayer("vocab_logits", lambda stack, x_BLD: stack.embedder.vocab_logits(x_BLD))
