"""Narang et al. 2021, "Do Transformer Modifications Transfer Across Implementations and
Applications?" (EMNLP 2021, arXiv 2102.11972), Table 1 as data: every modification a config
delta on the paper's "Vanilla Transformer", rendered beside the paper's numbers.

The vanilla baseline (the paper's section 3 and its gin configs, google-research
transformer_modifications/gin/models/vanilla_transformer_rel_bias_shared.gin): T5 1.0 base
sizes (12 + 12 layers, d_model 768, 12 heads of 64, d_ff 3072, ReLU), LayerNorm (with bias)
before each sub-layer and at the end of each stack, T5's relative position bias shared across
layers and no absolute positions, one embedding shared by the encoder input, decoder input and
(rescaled) softmax. Pretraining: span corruption (mean span 3, 15%) on C4, 2^19 steps of
65,536 tokens (128 x 512), Adafactor with the inverse square root schedule, no dropout; the
early loss is at 65,536 steps. Finetuning: dropout 0.1, constant learning rate 5e-4, on
SuperGLUE and XSum (2^18 steps) and closed-book WebQuestions (30,000 steps); WMT'14 En-De is
trained from scratch (150,000 steps). ReZero and Fixup use Adam (the paper: Adafactor did not
train them).

Each row's overrides hold at every scale: sizes are ratios of the scale's model (the depth
rows keep the paper's layers : d_ff : heads proportions), so `--scale tiny` runs the same
deltas on the tiny model. The paper columns: Params (M), Ops (T: total operations of a step),
Step/s (pretraining steps per second on its TPU slice), Early loss (mean over 5 runs at
65,536 steps; EARLY_LOSS_STD holds its standard deviation), Final loss (524,288 steps),
SGLUE (SuperGLUE average), XSum (ROUGE-2), WebQ (accuracy), WMT EnDe (BLEU, no pretraining).

The architecture rows' layers live in t5lite/models/ (the comment above each row names the
reference gin it follows).
"""

from __future__ import annotations

from t5lite.ablations.overrides import scaled
from t5lite.ablations.tables import Row, Table

COLUMNS = ("Params (M)", "Ops (T)", "Step/s", "Early loss", "Final loss", "SGLUE", "XSum",
           "WebQ", "WMT EnDe")
LOWER_IS_BETTER = ("Early loss", "Final loss")
DECIMALS = (("Params (M)", 0), ("Ops (T)", 1), ("Early loss", 3), ("Final loss", 3))

# The paper's Table 1, row by row (arXiv 2102.11972v2), one value per COLUMNS. The
# Dynamic convolution row as printed in the paper's PDF.
PAPER = {
    "vanilla": (223, 11.1, 3.50, 2.182, 1.838, 71.66, 17.78, 23.02, 26.62),
    "gelu": (223, 11.1, 3.58, 2.179, 1.838, 75.79, 17.86, 25.13, 26.47),
    "swish": (223, 11.1, 3.62, 2.186, 1.847, 73.77, 17.74, 24.34, 26.75),
    "elu": (223, 11.1, 3.56, 2.270, 1.932, 67.83, 16.73, 23.02, 26.08),
    "glu": (223, 11.1, 3.59, 2.174, 1.814, 74.20, 17.42, 24.34, 27.12),
    "geglu": (223, 11.1, 3.55, 2.130, 1.792, 75.96, 18.27, 24.87, 26.87),
    "reglu": (223, 11.1, 3.57, 2.145, 1.803, 76.17, 18.36, 24.87, 27.02),
    "selu": (223, 11.1, 3.55, 2.315, 1.948, 68.76, 16.76, 22.75, 25.99),
    "swiglu": (223, 11.1, 3.53, 2.127, 1.789, 76.00, 18.20, 24.34, 27.02),
    "liglu": (223, 11.1, 3.59, 2.149, 1.798, 75.34, 17.97, 24.34, 26.53),
    "sigmoid": (223, 11.1, 3.63, 2.291, 1.867, 74.31, 17.51, 23.02, 26.30),
    "softplus": (223, 11.1, 3.47, 2.207, 1.850, 72.45, 17.65, 24.34, 26.89),
    "rms_norm": (223, 11.1, 3.68, 2.167, 1.821, 75.45, 17.94, 24.07, 27.14),
    "rezero": (223, 11.1, 3.51, 2.262, 1.939, 61.69, 15.64, 20.90, 26.37),
    "rezero_layer_norm": (223, 11.1, 3.26, 2.223, 1.858, 70.42, 17.58, 23.02, 26.29),
    "rezero_rms_norm": (223, 11.1, 3.34, 2.221, 1.875, 70.33, 17.32, 23.02, 26.19),
    "fixup": (223, 11.1, 2.95, 2.382, 2.067, 58.56, 14.42, 23.02, 26.31),
    "depth24": (224, 11.1, 3.33, 2.200, 1.843, 74.89, 17.75, 25.13, 26.89),
    "depth18": (223, 11.1, 3.38, 2.185, 1.831, 76.45, 16.83, 24.34, 27.10),
    "depth8": (223, 11.1, 3.69, 2.190, 1.847, 74.58, 17.69, 23.28, 26.85),
    "depth6": (223, 11.1, 3.70, 2.201, 1.857, 73.55, 17.59, 24.60, 26.66),
    "block_sharing": (65, 11.1, 3.91, 2.497, 2.164, 64.50, 14.53, 21.96, 25.48),
    "block_sharing_factorized": (45, 9.4, 4.21, 2.631, 2.183, 60.84, 14.00, 19.84, 25.27),
    "block_sharing_factorized_shared": (20, 9.1, 4.37, 2.907, 2.385, 53.95, 11.37, 19.84,
                                        25.19),
    "encoder_block_sharing": (170, 11.1, 3.68, 2.298, 1.929, 69.60, 16.23, 23.02, 26.23),
    "decoder_block_sharing": (144, 11.1, 3.70, 2.352, 2.082, 67.93, 16.13, 23.81, 26.08),
    "factorized_embed": (227, 9.4, 3.80, 2.208, 1.855, 70.41, 15.92, 22.75, 26.50),
    "factorized_shared_embed": (202, 9.1, 3.92, 2.320, 1.952, 68.69, 16.33, 22.22, 26.44),
    "tied_encoder_decoder_input": (248, 11.1, 3.55, 2.192, 1.840, 71.70, 17.72, 24.34, 26.49),
    "tied_decoder_input_output": (248, 11.1, 3.57, 2.187, 1.827, 74.86, 17.74, 24.87, 26.67),
    "untied_embeddings": (273, 11.1, 3.53, 2.195, 1.834, 72.99, 17.58, 23.28, 26.48),
    "adaptive_input": (204, 9.2, 3.55, 2.250, 1.899, 66.57, 16.21, 24.07, 26.66),
    "adaptive_softmax": (204, 9.2, 3.60, 2.364, 1.982, 72.91, 16.67, 21.16, 25.56),
    "adaptive_softmax_no_projection": (223, 10.8, 3.43, 2.229, 1.914, 71.82, 17.10, 23.02,
                                       25.72),
    "mixture_of_softmaxes": (232, 16.3, 2.24, 2.227, 1.821, 76.77, 17.62, 22.75, 26.82),
    "transparent_attention": (223, 11.1, 3.33, 2.181, 1.874, 54.31, 10.40, 21.16, 26.80),
    "dynamic_conv": (257, 11.8, 2.65, 2.403, 2.047, 58.30, 12.67, 21.16, 17.03),
    "lightweight_conv": (224, 10.4, 4.07, 2.370, 1.989, 63.07, 14.86, 23.02, 24.73),
    "evolved_transformer": (217, 9.9, 3.09, 2.220, 1.863, 73.67, 10.76, 24.07, 26.58),
    "synthesizer_dense": (224, 11.4, 3.47, 2.334, 1.962, 61.03, 14.27, 16.14, 26.63),
    "synthesizer_dense_plus": (243, 12.6, 3.22, 2.191, 1.840, 73.98, 16.96, 23.81, 26.71),
    "synthesizer_dense_plus_alpha": (243, 12.6, 3.01, 2.180, 1.828, 74.25, 17.02, 23.28,
                                     26.61),
    "synthesizer_factorized": (207, 10.1, 3.94, 2.341, 1.968, 62.78, 15.39, 23.55, 26.42),
    "synthesizer_random": (254, 10.1, 4.08, 2.326, 2.009, 54.27, 10.35, 19.56, 26.44),
    "synthesizer_random_plus": (292, 12.0, 3.63, 2.189, 1.842, 73.32, 17.04, 24.87, 26.43),
    "synthesizer_random_plus_alpha": (292, 12.0, 3.42, 2.186, 1.828, 75.24, 17.08, 24.08,
                                      26.39),
    "universal_transformer": (84, 40.0, 0.88, 2.406, 2.053, 70.13, 14.09, 19.05, 23.91),
    "mixture_of_experts": (648, 11.7, 3.20, 2.148, 1.785, 74.55, 18.13, 24.08, 26.94),
    "switch_transformer": (1100, 11.7, 3.18, 2.135, 1.758, 75.38, 18.02, 26.19, 26.81),
    "funnel_transformer": (223, 1.9, 4.30, 2.288, 1.918, 67.34, 16.26, 22.75, 23.20),
    "weighted_transformer": (280, 71.0, 0.59, 2.378, 1.989, 69.04, 16.98, 23.02, 26.30),
    "product_key_memory": (421, 386.6, 0.25, 2.155, 1.798, 75.16, 17.04, 23.55, 26.73),
}
# The early loss's standard deviation over the paper's 5 runs at 65,536 steps
EARLY_LOSS_STD = {
    "vanilla": 0.005, "gelu": 0.003, "swish": 0.003, "elu": 0.007, "glu": 0.003,
    "geglu": 0.006, "reglu": 0.004, "selu": 0.004, "swiglu": 0.003, "liglu": 0.005,
    "sigmoid": 0.019, "softplus": 0.011, "rms_norm": 0.008, "rezero": 0.003,
    "rezero_layer_norm": 0.006, "rezero_rms_norm": 0.009, "fixup": 0.012, "depth24": 0.007,
    "depth18": 0.005, "depth8": 0.005, "depth6": 0.010, "block_sharing": 0.037,
    "block_sharing_factorized": 0.305, "block_sharing_factorized_shared": 0.313,
    "encoder_block_sharing": 0.023, "decoder_block_sharing": 0.029, "factorized_embed": 0.006,
    "factorized_shared_embed": 0.010, "tied_encoder_decoder_input": 0.002,
    "tied_decoder_input_output": 0.007, "untied_embeddings": 0.005, "adaptive_input": 0.002,
    "adaptive_softmax": 0.005, "adaptive_softmax_no_projection": 0.009,
    "mixture_of_softmaxes": 0.017, "transparent_attention": 0.014, "dynamic_conv": 0.009,
    "lightweight_conv": 0.009, "evolved_transformer": 0.003, "synthesizer_dense": 0.021,
    "synthesizer_dense_plus": 0.010, "synthesizer_dense_plus_alpha": 0.007,
    "synthesizer_factorized": 0.017, "synthesizer_random": 0.012,
    "synthesizer_random_plus": 0.004, "synthesizer_random_plus_alpha": 0.007,
    "universal_transformer": 0.036, "mixture_of_experts": 0.006, "switch_transformer": 0.007,
    "funnel_transformer": 0.008, "weighted_transformer": 0.021, "product_key_memory": 0.003,
}

# The vanilla Transformer at any scale: the scale's sizes with T5 1.0's d_ff = 4 d_model and
# ReLU, LayerNorm before each sub-layer, shared relative attention bias, all three embeddings
# tied (the tied softmax rescaled by d_model**-0.5 as T5 1.0), biases in the FFN's dense
# layers (DenseReluDense.use_bias = True). The T5 paper's tables use RMSNorm and no biases;
# this baseline does not (vanilla_transformer.gin).
VANILLA = ("model.ffn=relu", "model.d_ff:=4 * cfg.model.d_model", "model.norm=layernorm",
           "model.pre_norm=True", "model.position=relative", "model.tie_embeddings=True",
           "model.scale_tied_logits=True", "model.embed_dim=0", "model.ffn_bias=True")
PRETRAIN = ("data.mixture_or_task=corpus_span_corruption",
            "data.feature_lengths.targets:=span_targets(L, 0.15, 3)",
            "model.dropout_rate=0.0",  # "We do not use any regularization during pre-training"
            # the held-out loss at 1/8 of the steps (the paper's 65,536 of 524,288) and at the
            # end: pretrain_columns.EARLY_FRACTION
            "train.eval_every:=max(1, round(cfg.train.steps / 8))")
FINETUNE = ("model.dropout_rate=0.1",)
# --scale paper: finetuning at a constant 5e-4 (the paper; its warm-up restarts at the
# pretrained step, which a run that continues the pretraining's count has passed), a
# checkpoint every 2,500 steps, the best one reported (the paper; WebQuestions every 1,000:
# paper.DOWNSTREAM). The published commands save every 2,400 (transformer_modifications
# README.md, utils.run.save_checkpoints_steps); the paper's text is followed.
PAPER_FINETUNE = ("optim.learning_rate=5e-4", "optim.schedule=constant",
                  "checkpoint.every_steps=2500", "data.paper_vocabulary=cc_en")
# --scale paper pretraining: the early / final loss columns from 100 batches of 128 held-out
# sequences (12,800 x 512 tokens), what the paper's perplexity eval read: Mesh TF's utils.run
# perplexity_eval_steps=100 (mesh_tensorflow/transformer/utils.py :2649, kept by T5's
# perplexity_eval.gin and the published command, transformer_modifications README.md) at its
# batch of 65,536 tokens. The 4 batches configs/quickstart.py evaluates (512 sequences) have a
# 5x larger standard error (sqrt of 25x fewer sequences) on a column whose rows sit 0.003 from
# the vanilla's and whose runs spread 0.003-0.005 (EARLY_LOSS_STD); 8 evaluations x 100 steps
# add 0.15% to the 524,288 training steps.
# The loss is over the paper's vocabulary: Narang et al.'s English-only cc_en 32k
# (transformer_modifications tasks.py :34, c4_v231_unsupervised_en32k), not T5's cc_all, with
# which the same model's loss is another number (tasks/vocabularies.py CC_EN_PATH).
PAPER_PRETRAIN = ("train.eval_steps=100", "data.paper_vocabulary=cc_en")
# ReZero and Fixup train with Adam as the paper's code sets it up (defaults_adam.gin with
# learning_rate_schedules/adam.gin): Mesh TF's AdamWeightDecayOptimizer (epsilon 1e-6, no
# weight decay) at 0.05 * linear_warmup(4,000) * truncated_rsqrt(10,000) = a ramp from 0 to
# 5e-4 over 4,000 steps, constant to 10,000, then inverse square root (at other scales the
# same shape over the scale's warm-up: ramp over 0.4 of it); its model side: queries scaled
# at run time, not folded into their init (SelfAttention.fold_scaling_into_initializer =
# False), and the token embedding parametrized like a classifier's weights
# (VocabEmbedding.scale_variable_like_classifier_weights). Mesh TF's Adam has no bias
# correction (mesh_tensorflow/optimize.py AdamWeightDecayOptimizer.apply_grad :171-174:
# m / (sqrt(v) + eps) from the raw moments), optax's has: optim.bias_correction=False
# (train/optim.py scale_by_adam_uncorrected), in finetuning too (it continues the state).
ADAM = ("optim.name=adamw", "optim.learning_rate=5e-4", "optim.schedule=rsqrt",
        "optim.ramp_steps:=max(1, round(cfg.optim.warmup_steps * 4000 / 10000))",
        "optim.eps=1e-6", "optim.weight_decay=0.0", "optim.bias_correction=False")
ADAM_MODEL = ("model.scale_attn_logits=True", "model.scale_tied_logits=False",
              "model.embed_like_classifier=True")
ADAM_FINETUNE = ("optim.name=adamw", "optim.learning_rate=5e-5", "optim.schedule=constant",
                 "optim.eps=1e-6", "optim.weight_decay=0.0", "optim.bias_correction=False")


def _depth(layers: int, d_ff: int, heads: int) -> tuple:
    """The paper's depth row at equal parameters: its layers, d_ff and heads relative to the
    vanilla 12 layers, d_ff 3072, 12 heads."""
    return (scaled("num_encoder_layers", f"{layers} / 12"),
            scaled("num_decoder_layers", f"{layers} / 12"),
            scaled("d_ff", f"{d_ff} / 3072"), scaled("num_heads", f"{heads} / 12"))


def _row(name: str, label: str, both: tuple = (), pretrain: tuple = (),
         finetune: tuple = ()) -> Row:
    return Row(name, (label,), both=both, pretrain=pretrain, finetune=finetune,
               paper=PAPER[name])


def _clusters(counts: tuple, widths: tuple) -> str:
    """model.vocab_clusters as the paper's clusters at the scale's sizes: cluster boundaries at
    the paper's fractions of its 32,128-token vocabulary (so the counts sum to the scale's
    vocabulary), widths as fractions of its d_model 768 (768 = d_model: no projection)."""
    parts, previous, bound = [], "0", 0
    for count, width in zip(counts, widths):
        bound += count
        edge = f"round(cfg.model.vocab_size * {bound} / 32128)"
        size = "0" if width == 768 else f"{{max(1, round(cfg.model.d_model * {width} / 768))}}"
        parts.append(f"{{{edge} - {previous}}}:{size}")
        previous = edge
    return "model.vocab_clusters:=f'" + ",".join(parts) + "'"


GATED = scaled("d_ff", "2048 / 3072")  # the GLU rows: 3 matrices in the params of 2
BLOCK_SHARING = ("model.share_encoder_block=True", "model.share_decoder_block=True")
UNTIED_SOFTMAX = ("model.tie_embeddings=False",)
FACTORIZED = ("model.factorized_embed_dim:=min(128, cfg.model.d_model)",)
SOFTMAX_CLUSTERS = (2500, 6000, 23500, 128)  # the last: the sentinels (extra ids)
MOE = ("model.num_experts=32", "model.moe_group_size=1024",
       "model.ffn_layer_every:=max(1, cfg.model.num_encoder_layers // 3)",
       "model.ffn_init_scale=0.1", "model.decoder_expert_capacity_factor=1.25",
       "model.decoder_expert_capacity_factor_eval=2.0")
# Weights sized by the sequence length (the Synthesizers' model.max_length slots) cap the
# finetuning inputs at that length, keeping the batch's tokens: XSum's 2,048 inputs become
# 512, as the paper's code's xsum_v110_512.gin for models that cannot take longer inputs
LENGTH_BOUND = ("data.batch_size:=cfg.data.batch_size * L // min(L, cfg.model.max_length)",
                "data.feature_lengths.inputs:=min(L, cfg.model.max_length)")
# The Synthesizer rows (synthesizer_*.gin: Mesh TF's Synthesizer as every layer's self-
# attention, models/synthesizer.py) build the reference's variables exactly, so their counts
# are the reference code's, not the paper's Params column: a layer has q, kv (the values), o
# and pi [64, 512] (dense), q, k, v, o and pi (dense plus), kv, o and R1, R2 [16, 12, 512]
# (factorized), kv, o and R [512, 12, 512] (random) or q, k, v, o and R (random plus), against
# the vanilla's q, k, v, o: 209.7, 223.8, 199.5, 270.2 and 298.5M (the alpha forms one scalar
# a layer more) where the paper prints 224, 243, 207, 254 and 292. No consistent layer set or
# unused projection explains the paper's: its dense row (fewer weights a layer than the
# vanilla's) is above the vanilla's 223M.
SYNTHESIZERS = (("dense", "dense"), ("dense_plus", "dense plus"),
                ("dense_plus_alpha", "dense plus alpha"), ("factorized", "factorized"),
                ("random", "random"), ("random_plus", "random plus"),
                ("random_plus_alpha", "random plus alpha"))

ROWS = (
    _row("vanilla", "Vanilla Transformer"),
    # activations (the feed-forward block's)
    _row("gelu", "GeLU", ("model.ffn=gelu_tanh",)),
    _row("swish", "Swish", ("model.ffn=silu",)),
    _row("elu", "ELU", ("model.ffn=elu",)),
    _row("glu", "GLU", ("model.ffn=glu", GATED)),
    _row("geglu", "GeGLU", ("model.ffn=geglu", GATED)),
    _row("reglu", "ReGLU", ("model.ffn=reglu", GATED)),
    _row("selu", "SeLU", ("model.ffn=selu",)),
    _row("swiglu", "SwiGLU", ("model.ffn=swiglu", GATED)),
    _row("liglu", "LiGLU", ("model.ffn=bilinear", GATED)),
    _row("sigmoid", "Sigmoid", ("model.ffn=sigmoid",)),
    _row("softplus", "Softplus", ("model.ffn=softplus",)),
    # normalization
    _row("rms_norm", "RMS Norm", ("model.norm=rmsnorm",)),
    _row("rezero", "Rezero", ("model.norm=none", "model.rezero=True") + ADAM_MODEL, ADAM,
         ADAM_FINETUNE),
    _row("rezero_layer_norm", "Rezero + LayerNorm", ("model.rezero=True",) + ADAM_MODEL, ADAM,
         ADAM_FINETUNE),
    _row("rezero_rms_norm", "Rezero + RMS Norm",
         ("model.norm=rmsnorm", "model.rezero=True") + ADAM_MODEL, ADAM, ADAM_FINETUNE),
    _row("fixup", "Fixup",
         # fixup.gin: DenseReluDenseFixup.use_bias = False
         ("model.norm=none", "model.fixup=True", "model.dtype=float32", "model.ffn_bias=False")
         + ADAM_MODEL, ADAM,
         ADAM_FINETUNE),
    # depth at equal parameters
    _row("depth24", "24 layers, d_ff = 1536, H = 6", _depth(24, 1536, 6)),
    _row("depth18", "18 layers, d_ff = 2048, H = 8", _depth(18, 2048, 8)),
    _row("depth8", "8 layers, d_ff = 4608, H = 18", _depth(8, 4608, 18)),
    _row("depth6", "6 layers, d_ff = 6144, H = 24", _depth(6, 6144, 24)),
    # embeddings and parameter sharing (the block-sharing rows untie the softmax, as the paper)
    _row("block_sharing", "Block sharing", BLOCK_SHARING + UNTIED_SOFTMAX),
    _row("block_sharing_factorized", "+ Factorized embeddings",
         BLOCK_SHARING + UNTIED_SOFTMAX + FACTORIZED),
    _row("block_sharing_factorized_shared", "+ Factorized & shared embeddings",
         BLOCK_SHARING + FACTORIZED),
    _row("encoder_block_sharing", "Encoder only block sharing",
         ("model.share_encoder_block=True",) + UNTIED_SOFTMAX),
    _row("decoder_block_sharing", "Decoder only block sharing",
         ("model.share_decoder_block=True",) + UNTIED_SOFTMAX),
    _row("factorized_embed", "Factorized Embedding", UNTIED_SOFTMAX + FACTORIZED),
    _row("factorized_shared_embed", "Factorized & shared embeddings", FACTORIZED),
    _row("tied_encoder_decoder_input", "Tied encoder/decoder input embeddings", UNTIED_SOFTMAX),
    _row("tied_decoder_input_output", "Tied decoder input and output embeddings",
         ("model.tie_encoder_decoder_embeddings=False",)),
    _row("untied_embeddings", "Untied embeddings",
         ("model.tie_encoder_decoder_embeddings=False",) + UNTIED_SOFTMAX),
    _row("adaptive_input", "Adaptive input embeddings",
         ("model.adaptive_input=True", _clusters((2500, 6000, 23628), (768, 256, 64)))),
    # softmax (models/vocab_layers.py: log-probabilities over the whole vocabulary)
    _row("adaptive_softmax", "Adaptive softmax",
         ("model.output_softmax=adaptive", _clusters(SOFTMAX_CLUSTERS, (768, 256, 64, 768)))),
    _row("adaptive_softmax_no_projection", "Adaptive softmax without projection",
         ("model.output_softmax=adaptive", _clusters(SOFTMAX_CLUSTERS, (768,) * 4))),
    _row("mixture_of_softmaxes", "Mixture of softmaxes",
         ("model.output_softmax=mixture", "model.mos_components=15")),
    # architectures
    # each decoder layer cross-attends to its own softmax-weighted sum of the embeddings and
    # every encoder layer's output (models/transparent.py)
    _row("transparent_attention", "Transparent attention", ("model.transparent_attention=True",)),
    # the reference's convolutions: one kernel per channel (conv_heads=0: its gin's
    # num_unique_depth_filters never reaches the layer), 9 taps (encoder -4..4, decoder -8..0);
    # the dynamic row's d_ff 512 is its gin's
    _row("dynamic_conv", "Dynamic convolution",
         ("model.attention_type=dynamic_conv", scaled("d_ff", "512 / 3072"))),
    _row("lightweight_conv", "Lightweight convolution",
         ("model.attention_type=lightweight_conv",)),
    # one evolved block stands for two layers (the gin halves the depth)
    _row("evolved_transformer", "Evolved Transformer",
         ("model.block_type=evolved", scaled("num_encoder_layers", "6 / 12"),
          scaled("num_decoder_layers", "6 / 12"))),
) + tuple(_row(f"synthesizer_{key}", f"Synthesizer ({label})",
               (f"model.attention_type=synthesizer_{key}",), finetune=LENGTH_BOUND)
          for key, label in SYNTHESIZERS) + (
    # universal_transformer.gin (Mesh TF's UTLayerStack, models/sharing.py): one shared block
    # per stack applied 2 + 24 + 2 times (learned step embeddings on the 24), each sub-layer's
    # output GRU-gated, untied softmax. Its ACT settings are inert: recurrence_type "basic"
    # runs no halting. The gates are the 17.7M this count has over plain sharing (84M).
    _row("universal_transformer", "Universal Transformer",
         BLOCK_SHARING + UNTIED_SOFTMAX + ("model.universal_steps=24",
                                           "model.universal_mix_layers=2",
                                           "model.universal_gating=gru")),
    # the gins (mixture_of_experts.gin, switch_transformer.gin): 32 experts in the FFN of every
    # 4th layer of both stacks (3 of 12; every layer when a stack has fewer than 6), GShard
    # top-2 with experts of d_ff / 2 (FLOP-matched) and capacity factor 2, or top-1 with full
    # experts, capacity factor 1.2 and a 1e-2 multiplicative router jitter; load-balancing
    # loss weight 1e-2 (Mesh TensorFlow's default); every FFN, expert and router kernel at a
    # tenth of the init variance (the gins' global VarianceScalingInitializer.scale = 0.1;
    # attention and embeddings have their own initializers); padding routed nowhere
    # (models/moe.py). The gins bind the decoder's capacity factors under the scope
    # "deccoder/" (sic), which no layer enters, so the reference's decoder MoE layers kept
    # MoE1D's defaults, 1.25 in training and 2.0 in eval, as here (the encoder's: the row's).
    # Routing groups as the reference's: up to 1,024 tokens of the flattened batch
    # (moe_group_size; at paper scale two 512-token inputs, or 8 x 114 = 912 targets, share
    # one capacity). Not reproduced: its top-2 drops second choices at random in eval too
    # (second_policy_eval "random"), where this code's eval, which draws no random numbers,
    # keeps them all.
    _row("mixture_of_experts", "Mixture of experts", MOE + (
        "model.ffn_layer=moe", "model.expert_capacity_factor=2.0",
        "model.expert_d_ff:=max(1, cfg.model.d_ff // 2)")),
    _row("switch_transformer", "Switch Transformer", MOE + (
        "model.ffn_layer=switch", "model.expert_capacity_factor=1.2",
        "model.router_jitter=0.01")),
    # funnel_transformer.gin: the 12 encoder layers in 3 blocks of 4, mean-pooled by 2 at the
    # start of the 2nd and 3rd; no packing ("not supported for Funnel Transformer"); RMS norm
    # in the encoder's layers and after them (its sublayers_per_layer / sublayers_final,
    # :17-27), the decoder keeping the vanilla LayerNorm
    _row("funnel_transformer", "Funnel Transformer", ("model.encoder_norm=rmsnorm",
        "model.funnel_blocks:=[b for b in [cfg.model.num_encoder_layers // 3 + "
        "(cfg.model.num_encoder_layers % 3 > 0), cfg.model.num_encoder_layers // 3 + "
        "(cfg.model.num_encoder_layers % 3 > 1), cfg.model.num_encoder_layers // 3] if b]",
        "data.pack=False")),
    # branched attention (self and cross) with the FFN inside, kappa / alpha unconstrained as
    # the reference ran them (models/weighted.py). Every weight trains with the model's
    # schedule, which is what the gin's AdafactorWithMultiLRSchedule did: its variable_search
    # "branched" is a case-sensitive re.search over names whose scope is
    # "BranchedSelfAttention" / "BranchedEncDecAttention", so no variable took the alternative
    # schedule (which would also have covered the layers' q / k / v / o and FFN, and was
    # slanted_triangular times learning_rate_cut_off, a factor that returns the step number
    # before the cut-off, not 1)
    _row("weighted_transformer", "Weighted Transformer", ("model.weighted_transformer=True",)),
    # product_key_memory.gin: the memory replaces the FFN of the decoder's 11th of 12 layers.
    # Its sizes come from models/pkm.gin, which the published code does not include: the
    # paper's appendix says "knn = 32, 128 keys, 512 memory slots", read as 128-wide keys and
    # 512 sub-keys a half (512^2 slots of d_model values); it gives no head count, and 8 is
    # the one that then makes the paper's 421M (the count grows 1,281 a unit of heads x key
    # width: 4 x 512, Lample et al.'s, 422.3M; 4 x 128 420.3M; 8 x 128 421.0M). Values and
    # keys initialised as memory_layers.py's with model.initializers=mesh_tf (models/pkm.py).
    # The paper's Ops (386.6 T) and Step/s (0.25) are the reference's read: mtf.gather is a
    # one-hot einsum over all 262,144 slots (376 T multiply-adds a step); models/pkm.py
    # gathers the 32 slots, so its compiled cost is near the vanilla's (bench/RESULTS.md)
    _row("product_key_memory", "Product key memory", (
        "model.ffn_layer=pkm", "model.ffn_layer_stacks=decoder", "model.ffn_layer_at=(-2,)",
        "model.pkm_keys=512", "model.pkm_heads=8", "model.pkm_knn=32", "model.pkm_key_dim=128")),
)

TABLE = Table(
    name="modifications",
    caption="Do Transformer modifications transfer? (Narang et al. 2021, Table 1): each "
            "modification against the vanilla Transformer.",
    label_columns=("Model",),
    baseline="vanilla",
    pretrain=VANILLA + PRETRAIN,
    finetune=VANILLA + FINETUNE,
    rows=ROWS,
    paper_columns=COLUMNS,
    paper_std=(0.0,) * len(COLUMNS),
    paper_source="Paper: Narang et al. 2021 (arXiv 2102.11972) Table 1: parameters, "
                 "operations and steps per second of pretraining, the C4 loss at 65,536 and "
                 "524,288 steps, the SuperGLUE average, XSum ROUGE-2 and WebQuestions "
                 "accuracy after finetuning (validation sets), WMT'14 En-De BLEU without "
                 "pretraining; bold = better than the vanilla Transformer (the paper's rule).",
    # tasks/narang_tasks.py holds the split this table reads: train[3417:] (361 questions)
    paper_note="WebQuestions has no validation split: as the paper's code, the last 361 of "
               "its 3,778 training questions are held out and reported (every WebQ number of "
               "the paper but one is a multiple of 1/378, so the paper may have held out 378).",
    bold_vs_baseline=True,
    lower_is_better=LOWER_IS_BETTER,
    plain_columns=("Params (M)", "Ops (T)", "Step/s"),
    paper_decimals=DECIMALS,
    pretrain_columns=True,
    scale_overrides=(("paper", PAPER_PRETRAIN, PAPER_FINETUNE),),
    scale_tasks=(("paper", ("super_glue", "xsum", "web_questions", "wmt_ende_scratch")),),
)
