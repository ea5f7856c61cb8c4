"""Published model sizes as Config builders, so each configs/*.py file is three lines.

Sizes (d_model, d_ff, num_heads, head_dim, layers per stack) follow the released checkpoints:
T5 v1.0 (Raffel et al. 2020), T5 v1.1 (GeGLU, untied head, no pretraining dropout), BERT
(Devlin et al. 2019) and GPT-2 (Radford et al. 2019). "tiny" sizes run the tests and the
quickstart on a laptop CPU with the project's 8k SentencePiece vocabulary (8000 pieces + 100
sentinels = 8100, padded to 8192).

Each size also states the TPU slice it is meant for (mesh.topology) with the mesh, remat and
batch that train it fastest there (SLICES below): what `t5lite compile` compiles with no flags.
"""

from __future__ import annotations

import dataclasses

from t5lite.config import (Config, DataConfig, MeshConfig, ModelConfig, OptimizerConfig,
                           TrainConfig)
from t5lite.errors import UserError

TINY_VOCAB = 8192

T5_1_0 = {  # d_model, d_ff, heads, head_dim, layers
    "tiny": (128, 512, 4, 32, 2),
    "small": (512, 2048, 8, 64, 6),
    "base": (768, 3072, 12, 64, 12),
    "large": (1024, 4096, 16, 64, 24),
    "3b": (1024, 16384, 32, 128, 24),
    "11b": (1024, 65536, 128, 128, 24),
}
T5_1_1 = {
    "tiny": (128, 384, 4, 32, 2),
    "small": (512, 1024, 6, 64, 8),
    "base": (768, 2048, 12, 64, 12),
    "large": (1024, 2816, 16, 64, 24),
    "xl": (2048, 5120, 32, 64, 24),
    "xxl": (4096, 10240, 64, 64, 24),
}
BERT = {
    "tiny": (128, 512, 4, 32, 2),
    "base": (768, 3072, 12, 64, 12),
    "large": (1024, 4096, 16, 64, 24),
}
GPT2 = {
    "tiny": (128, 512, 4, 32, 2),
    "small": (768, 3072, 12, 64, 12),
    "medium": (1024, 4096, 16, 64, 24),
    "large": (1280, 5120, 20, 64, 36),
}


@dataclasses.dataclass(frozen=True)
class Slice:
    """The TPU slice a preset is meant for and its best settings there, as `t5lite compile
    --search` ranks them (bench/TPU_PLAN.md; bench/RESULTS.md, issue 34): remat policy, global
    batch (0: the recipe's), tensor-parallel width, and whether parameters and optimizer state
    are sharded over every chip (parallel="fsdp": mesh data=1, fsdp=-1) or copied on each
    (parallel="data": data=-1, fsdp=1; a small model whose gathers cost more than its
    copies, or a tensor-parallel one whose quarter of the state fits each chip). Either
    way the same config trains on one CPU or GPU; one with tensor > 1 needs a device count
    its width divides (else one line names `--set mesh.tensor=1`)."""
    topology: str
    remat: str = "none"
    batch: int = 0
    tensor: int = 1
    parallel: str = "fsdp"


# Tiny sizes run the tests and the quickstart on a laptop CPU: one chip is their slice, and
# their mesh stays data-parallel (the tests' 8 simulated devices split the batch).
TINY = Slice("v5litepod-1")
# t5x trains T5 v1.1 on C4 at batch 256 x (512, 114) (examples/t5/t5_1_1/examples/
# c4_pretrain.gin); XL and XXL ship it, the smaller sizes the paper's 128.
# Remat and mesh by expected step on the slice (bench/RESULTS.md, "Whole --search runs": the
# figures, and what was not compiled): a whole `t5lite compile --search` picked bert_base's,
# electra_small's, the three GPT-2 sizes' and T5 v1.0 small's (held at tensor 1 first) and
# confirmed T5 v1.1 small's and base's, T5 v1.0 base's and roberta_base's; a search held at
# 4-way tensor parallelism (`--search --set mesh.tensor=4`: every remat, collective-matmul and
# data / fsdp split at that width) T5 v1.1 XXL's and T5 v1.0 11B's, one held at tensor 1
# confirmed XL's, large's, BERT large's and T5 v1.0 large's and picked 3B's.
SLICES = {
    # small: 60M parameters, copied on each chip (3% faster than fsdp 4 by expected step)
    "t5_1_0": {"tiny": TINY, "small": Slice("v5p-8", "full", parallel="data"),
               "base": Slice("v5p-8", "full"),
               "large": Slice("v5p-16", "full"), "3b": Slice("v5p-32", "minimal"),
               # 4-way tensor parallelism with the rest of the state copied 16 ways: fsdp
               # over 64 chips left most of the step in exposed gathers (bench/RESULTS.md)
               "11b": Slice("v5p-128", "minimal", tensor=4, parallel="data")},
    "t5_1_1": {"tiny": TINY, "small": Slice("v5p-8", "full"), "base": Slice("v5p-8"),
               "large": Slice("v5p-16"), "xl": Slice("v5p-64", batch=256),
               # 4-way tensor parallelism: fsdp over all 128 chips left most of the step
               # in exposed weight gathers (bench/RESULTS.md); t5x trains XXL model-parallel
               "xxl": Slice("v5p-256", "minimal", batch=256, tensor=4)},
    # base: 1.2 GiB of state, copied on each chip costs less than gathering it
    "bert": {"tiny": TINY, "base": Slice("v5p-8", "full", parallel="data"),
             "large": Slice("v5p-16", "minimal")},
    "roberta": {"tiny": TINY, "base": Slice("v5p-8", "full")},
    # 512 x 1024 tokens and 50257-way logits: without remat GPT-2 did not fit 4 or 8 chips
    "gpt2": {"tiny": TINY, "small": Slice("v5p-32", "minimal"),
             "medium": Slice("v5p-64", "minimal"), "large": Slice("v5p-64", "minimal")},
    # 14M parameters: copied on each chip, as BERT base
    "electra": {"tiny": TINY, "small": Slice("v5p-8", "minimal", parallel="data")},
}


def _on_slice(cfg: Config, family: str, size: str) -> Config:
    """cfg with the slice, mesh, remat and batch of SLICES[family][size]."""
    s = SLICES[family][size]
    cfg.model.remat = s.remat
    if s.batch:
        cfg.data.batch_size = s.batch
    if s is TINY:
        cfg.mesh = MeshConfig(topology=s.topology)
    elif s.parallel == "data":
        cfg.mesh = MeshConfig(data=-1, fsdp=1, tensor=s.tensor, topology=s.topology)
    else:
        cfg.mesh = MeshConfig(data=1, fsdp=-1, tensor=s.tensor, topology=s.topology)
    return cfg


def _size(table: dict, family: str, size: str):
    if size not in table:
        raise UserError(f"unknown {family} size {size!r}; choose from {', '.join(table)}.")
    return table[size]


def _common(size: str, d, f, h, k) -> dict:
    return dict(d_model=d, d_ff=f, num_heads=h, head_dim=k,
                dtype="float32" if size == "tiny" else "bfloat16",
                # 2-layer stacks: loop-free layers (same params), faster CPU steps
                scan_unroll=0 if size == "tiny" else 1)


def _t5(version: str, table: dict, size: str, **model) -> Config:
    d, f, h, k, n = _size(table, f"T5 {version}", size)
    m = ModelConfig(architecture="encoder_decoder", num_encoder_layers=n, num_decoder_layers=n,
                    vocab_size=TINY_VOCAB if size == "tiny" else 32128, position="relative",
                    norm="rmsnorm", norm_eps=1e-6, pre_norm=True, **_common(size, d, f, h, k),
                    **model)
    if size == "tiny":
        data = DataConfig("corpus_span_corruption", {"inputs": 128, "targets": 32}, batch_size=32)
        optim = OptimizerConfig("adafactor", learning_rate=1e-2, schedule="rsqrt", warmup_steps=100)
        train = TrainConfig(steps=2000, eval_every=500)
    else:
        data = DataConfig("corpus_span_corruption_t5", {"inputs": 512, "targets": 114},
                          batch_size=128)
        optim = OptimizerConfig("adafactor", learning_rate=1e-2, schedule="rsqrt",
                                warmup_steps=10000)
        train = TrainConfig(steps=2 ** 19, eval_every=5000)
    return _on_slice(Config(name=f"t5_{version.replace('.', '_')}_{size}", model=m, data=data,
                            optim=optim, train=train), f"t5_{version.replace('.', '_')}", size)


def t5_1_0(size: str) -> Config:
    """T5 v1.0: ReLU MLP, tied embeddings with d_model**-0.5 output rescale, dropout 0.1."""
    return _t5("1.0", T5_1_0, size, ffn="relu", tie_embeddings=True, scale_tied_logits=True,
               dropout_rate=0.1)


def t5_1_1(size: str) -> Config:
    """T5 v1.1: GeGLU MLP, separate logits_dense, no dropout during pretraining."""
    return _t5("1.1", T5_1_1, size, ffn="geglu", tie_embeddings=False, scale_tied_logits=False,
               dropout_rate=0.0)


def bert(size: str) -> Config:
    """BERT: post-norm LayerNorm (eps 1e-12), exact GELU, biases, 2 token types, 512 learned
    positions, embedding LayerNorm, pooler. NSP is off (set model.nsp_head=True for it)."""
    d, f, h, k, n = _size(BERT, "BERT", size)
    tiny = size == "tiny"
    m = ModelConfig(architecture="encoder_only", num_encoder_layers=n, num_decoder_layers=0,
                    vocab_size=TINY_VOCAB if tiny else 30522, position="learned",
                    max_length=128 if tiny else 512, num_token_types=2, norm="layernorm",
                    norm_eps=1e-12, pre_norm=False, embed_norm=True, ffn="gelu", use_bias=True,
                    tie_embeddings=True, scale_tied_logits=False, scale_attn_logits=True,
                    init_std=0.02, pooler=True, dropout_rate=0.1,
                    # MLM logits only at masked positions: up to a quarter of the length
                    # (Google BERT: 20 of 128, 80 of 512); 15% masking overflows it ~never
                    mlm_predict_fraction=0.25, **_common(size, d, f, h, k))
    if tiny:
        data = DataConfig("corpus_mlm", {"inputs": 128}, batch_size=32)
        optim = OptimizerConfig("adamw", learning_rate=1e-3, schedule="linear", warmup_steps=100,
                                weight_decay=0.01, eps=1e-6)
        train = TrainConfig(steps=2000, z_loss=0.0, eval_every=500)
    else:
        data = DataConfig("corpus_mlm_bert", {"inputs": 512}, batch_size=256)
        optim = OptimizerConfig("adamw", learning_rate=1e-4, schedule="linear",
                                warmup_steps=10000, weight_decay=0.01, eps=1e-6)
        train = TrainConfig(steps=1_000_000, z_loss=0.0, eval_every=10000)
    return _on_slice(Config(name=f"bert_{size}", model=m, data=data, optim=optim, train=train),
                     "bert", size)


def roberta(size: str) -> Config:
    """RoBERTa (Liu et al. 2019): BERT's layers (LayerNorm eps 1e-5), no NSP and no pooler, one
    token type, MLM on packed full-sentence rows with a fresh mask every epoch (seqio's
    per-example stateless seeds: corpus_mlm_only), 512 positions (HF stores 514: offset by
    padding_idx + 1, see convert.py). Base keeps HF's 50265-id vocabulary so roberta-base
    weights import and export; pretraining it here reads the BERT WordPiece corpus task."""
    _size(BERT, "RoBERTa", size)
    tiny = size == "tiny"
    base = bert(size)
    m = dataclasses.replace(base.model, vocab_size=TINY_VOCAB if tiny else 50265,
                            num_token_types=1, norm_eps=1e-5, pooler=False, nsp_head=False,
                            hf_class="RobertaForMaskedLM")
    data = dataclasses.replace(base.data, mixture_or_task="corpus_mlm_only" if tiny
                               else "corpus_mlm_only_bert", pack=True)
    # RoBERTa's larger batches / peak LR (8k x 512, 6e-4); the tiny one keeps BERT tiny's
    optim = base.optim if tiny else dataclasses.replace(base.optim, learning_rate=6e-4,
                                                         warmup_steps=24000, b2=0.98)
    train = base.train if tiny else dataclasses.replace(base.train, steps=500_000)
    return _on_slice(Config(name=f"roberta_{size}", model=m, data=data, optim=optim,
                            train=train), "roberta", size)


# ELECTRA (Clark et al. 2020): d_model, d_ff, heads, head_dim, layers, embedding width,
# generator width. Small = HF google/electra-small-discriminator (embedding_size 128, hidden
# 256, 12 layers, 4 heads, FFN 1024). The generator is 1/4 of the discriminator's hidden / FFN /
# heads for Small (paper Table 6: 1/4 Small and Large, 1/3 Base); HF's released
# google/electra-small-generator is wider (hidden 256, 4 heads: the "Small++" recipe).
# tiny: BERT tiny's encoder, so the two compare at equal size.
ELECTRA = {
    "tiny": (128, 512, 4, 32, 2, 128, 32),
    "small": (256, 1024, 4, 64, 12, 128, 64),
}


def electra(size: str) -> Config:
    """ELECTRA: BERT's layers and embeddings (embedding width E, projected to d_model), no
    pooler / NSP / MLM head; a generator (MLM, shared embeddings) samples replacements at the
    masked positions and the discriminator's RTD head labels every token (lambda = 50)."""
    d, f, h, k, n, e, g = _size(ELECTRA, "ELECTRA", size)
    tiny = size == "tiny"
    base = bert("tiny" if tiny else "base")
    m = dataclasses.replace(base.model, vocab_size=TINY_VOCAB if tiny else 30522,
                            num_encoder_layers=n, embed_dim=0 if e == d else e, pooler=False,
                            nsp_head=False, **_common(size, d, f, h, k))
    m.electra = dataclasses.replace(m.electra, rtd_head=True, generator_d_model=g,
                                    generator_d_ff=f * g // d, generator_num_heads=h * g // d)
    data = dataclasses.replace(base.data, mixture_or_task="corpus_mlm" if tiny
                               else "corpus_mlm_bert", pack=False)
    # BERT's optimizer with its global-norm clipping at 1.0 (Google BERT / ELECTRA code): the
    # 50 x RTD gradient unclipped collapsed the tiny discriminator to the all-original prior
    optim = dataclasses.replace(base.optim, clip_grad_norm=1.0)
    train = base.train
    if not tiny:
        data.batch_size, data.feature_lengths = 128, {"inputs": 128}
    return _on_slice(Config(name=f"electra_{size}", model=m, data=data, optim=optim,
                            train=train), "electra", size)


def gpt2(size: str) -> Config:
    """GPT-2: pre-norm LayerNorm (eps 1e-5), tanh GELU, biases, 1024 learned positions, tied
    LM head without rescale."""
    d, f, h, k, n = _size(GPT2, "GPT-2", size)
    tiny = size == "tiny"
    m = ModelConfig(architecture="decoder_only", num_encoder_layers=0, num_decoder_layers=n,
                    vocab_size=TINY_VOCAB if tiny else 50257, position="learned",
                    max_length=256 if tiny else 1024, norm="layernorm", norm_eps=1e-5,
                    pre_norm=True, ffn="gelu_tanh", use_bias=True, tie_embeddings=True,
                    scale_tied_logits=False, scale_attn_logits=True, init_std=0.02,
                    dropout_rate=0.1, **_common(size, d, f, h, k))
    if tiny:
        data = DataConfig("corpus_lm", {"targets": 128}, batch_size=32)
        optim = OptimizerConfig("adamw", learning_rate=1e-3, schedule="cosine", warmup_steps=100,
                                weight_decay=0.1, b2=0.95, clip_grad_norm=1.0, min_lr_ratio=0.1)
        train = TrainConfig(steps=2000, z_loss=0.0, eval_every=500)
    else:
        data = DataConfig("corpus_lm_gpt2", {"targets": 1024}, batch_size=512)
        optim = OptimizerConfig("adamw", learning_rate=6e-4, schedule="cosine",
                                warmup_steps=2000, weight_decay=0.1, b2=0.95, clip_grad_norm=1.0,
                                min_lr_ratio=0.1)
        train = TrainConfig(steps=100_000, z_loss=0.0, eval_every=5000)
    return _on_slice(Config(name=f"gpt2_{size}", model=m, data=data, optim=optim, train=train),
                     "gpt2", size)
