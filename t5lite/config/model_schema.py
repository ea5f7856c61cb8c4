"""The model section of the config (ModelConfig with its PEFT and ELECTRA subsections): every
field with its default, allowed values and meaning. In a file of its own so model variants
(issue 38's modification rows among them) have room; schema.py re-exports it.
"""

from __future__ import annotations

import dataclasses

from t5lite.config.sections import Section, setting


@dataclasses.dataclass
class PeftConfig(Section):
    """Parameter-efficient finetuning (t5lite/peft/). All off by default.

    With any method on and ``train_only_peft``, only the PEFT params and ``train_also`` (new
    task heads) are trained; the optimizer allocates no state for the rest.
    """

    lora_rank: int = setting(0, bounds=(0, None))  # 0 = no LoRA
    lora_alpha: float = 16.0  # LoRA update scaled by lora_alpha / lora_rank
    # DenseGeneral module names (globs) that get LoRA: query key value out wi wi_0 wi_1 wo
    lora_targets: tuple = ("query", "value")
    # prompt tuning: N soft tokens prepended to the (encoder) input
    prompt_tokens: int = setting(0, bounds=(0, None))
    # prefix tuning: N learned key/value vectors per self-attention
    prefix_tokens: int = setting(0, bounds=(0, None))
    # bottleneck adapters after attention and MLP (0 = off)
    adapter_dim: int = setting(0, bounds=(0, None))
    ia3: bool = False  # (IA)^3 scaling of keys, values and MLP hidden
    freeze: tuple = ()  # glob patterns of parameter paths kept frozen, e.g. ("encoder/*",)
    train_only_peft: bool = True  # with any PEFT option on, freeze everything else ...
    # ... except these (globs over param paths): freshly initialised task heads
    train_also: tuple = ("class_dense/*", "token_dense/*", "span_dense/*")
    # gradual unfreezing (T5 paper 3.5.1): train heads + the top `unfreeze_layers` layers of
    # encoder and decoder (in parallel), open `unfreeze_layers` more every `unfreeze_every`
    # steps; input embeddings with the bottom layer, a tied one throughout. 0 = off.
    unfreeze_every: int = setting(0, bounds=(0, None))
    unfreeze_layers: int = setting(1, bounds=(1, None))
    save_peft_params: bool = True  # write workdir/peft/<step>/ (PEFT params only) on save


@dataclasses.dataclass
class ElectraConfig(Section):
    """ELECTRA replaced-token detection (t5lite/models/electra.py; Clark et al. 2020). Off by
    default. On an encoder_only model, ``rtd_head`` adds the discriminator head (one logit per
    token: original or replaced); ``generator_d_model > 0`` adds the generator, a small BERT
    MLM sharing the embeddings that samples replacements at the masked positions (pretraining).
    Loss = MLM(generator) + rtd_weight * RTD. With num_classes > 0 only the discriminator runs.
    """

    rtd_head: bool = False
    generator_d_model: int = 0  # 0 = no generator (finetuning, or an imported discriminator)
    generator_d_ff: int = 0  # 0 = d_ff scaled like d_model
    generator_num_heads: int = 0  # 0 = generator_d_model // head_dim (the same head width)
    generator_layers: int = 0  # 0 = num_encoder_layers
    rtd_weight: float = 50.0  # the paper's lambda


@dataclasses.dataclass
class ModelConfig(Section):
    """One config for all three families; variants are fields, not subclasses."""

    architecture: str = setting("encoder_decoder", choices=(
        "encoder_decoder", "decoder_only", "prefix_lm", "encoder_only"))
    shared_encoder_decoder: bool = False  # paper's "shared": one set of layer weights
    vocab_size: int = setting(32128, bounds=(1, None))
    d_model: int = setting(512, bounds=(1, None))
    num_heads: int = setting(8, bounds=(1, None))
    head_dim: int = setting(64, bounds=(1, None))
    d_ff: int = setting(2048, bounds=(1, None))
    # width of the token / position / token-type embeddings (ALBERT / ELECTRA factorisation,
    # HF embedding_size): 0 = d_model; else a dense embed_project maps it to d_model
    embed_dim: int = 0
    num_encoder_layers: int = setting(6, bounds=(0, None))
    num_decoder_layers: int = setting(6, bounds=(0, None))
    ffn: str = setting("relu", choices=("relu", "gelu", "gelu_tanh", "silu", "glu", "geglu",
                                        "reglu", "swiglu", "bilinear", "elu", "selu",
                                        "sigmoid", "softplus"))
    # "none": no norm layers (ReZero, Fixup: the residual branches are scaled instead)
    norm: str = setting("rmsnorm", choices=("rmsnorm", "layernorm", "none"))
    norm_eps: float = setting(1e-6, bounds=(0.0, None))
    pre_norm: bool = True  # False = post-norm (BERT)
    position: str = setting("relative", choices=("relative", "learned", "sinusoidal", "rope",
                                                 "alibi"))
    max_length: int = setting(512, bounds=(1, None))  # table size for learned positions
    relative_buckets: int = setting(32, bounds=(1, None))
    relative_max_distance: int = setting(128, bounds=(1, None))
    tie_embeddings: bool = True  # output projection = input embedding transposed
    use_bias: bool = False  # biases in dense layers (BERT, GPT-2)
    # biases in the FFN's dense layers only (Mesh TF's DenseReluDense.use_bias, which Narang et
    # al.'s vanilla Transformer sets); use_bias puts them in every dense layer
    ffn_bias: bool = False
    # BERT segment (token type) embeddings
    num_token_types: int = setting(0, bounds=(0, None))
    nsp_head: bool = False  # BERT next-sentence prediction head (implies pooler)
    pooler: bool = False
    # convert.py export target when the architecture has several: "RobertaForMaskedLM"
    # (RoBERTa: BERT layers, positions offset by padding_idx + 1); "" = by architecture
    hf_class: str = ""
    # >0 adds a classification head (see heads in architectures.py)
    num_classes: int = setting(0, bounds=(0, None))
    # >0: per-token tagging head (BIO), "token_logits" [B, L, C]
    num_token_classes: int = setting(0, bounds=(0, None))
    span_head: bool = False  # QA span extraction head: "start_logits" / "end_logits" [B, L]
    # SpanBERT's Span Boundary Objective head (models/sbo.py): "sbo_logits" when the batch
    # has encoder_span_* features (task corpus_spanbert); offsets beyond the table share its end
    sbo_head: bool = False
    sbo_max_span_length: int = 32
    # BERT MLM: 0 = vocabulary logits at every position (Hugging Face); f in (0, 1] = only at
    # the first N = ceil(f * L) positions per row with a nonzero encoder_loss_weight (Google
    # BERT's max_predictions_per_seq, e.g. 20 of 128): the [B, L, V] output layer shrinks to
    # [B, N, V]. Masked tokens beyond N in a row go unscored ("mlm_dropped_fraction" metric).
    mlm_predict_fraction: float = 0.0
    dropout_rate: float = 0.1
    # Dropout masks of the residual branches, the FFN hidden layer, the attention weights and
    # the embeddings / stack output: "none" = one draw per element; "length" = one per example
    # and feature, shared by every position (Mesh TF: transformer.py sublayer_dropout's
    # noise_shape batch + d_model, transformer_layers.py DenseReluDense's h.shape - length;
    # t5x's T5: nn.Dropout(broadcast_dims=(-2,))). The paper scale of the ablation tables sets
    # "length"; the presets keep "none" so saved configs and resumed runs mean what they meant.
    dropout_broadcast: str = setting("none", choices=("none", "length"))
    # Narang et al. 2021 architecture rows (issue 38). The FFN of chosen layers becomes a
    # mixture of experts (models/moe.py: "moe" GShard top-2, "switch" top-1) or a product key
    # memory ("pkm", models/pkm.py). Chosen: layers k, 2k, ... of each stack in
    # ffn_layer_stacks (k = ffn_layer_every), or the 0-based layers in ffn_layer_at (negative
    # counts from the end). Stacks whose layers differ are built unscanned.
    ffn_layer: str = setting("dense", choices=("dense", "moe", "switch", "pkm"))
    ffn_layer_every: int = setting(1, bounds=(1, None))
    ffn_layer_at: tuple = ()
    ffn_layer_stacks: str = setting("both", choices=("both", "encoder", "decoder"))
    num_experts: int = setting(32, bounds=(1, None))
    expert_d_ff: int = setting(0, bounds=(0, None), meaning=" (0 = d_ff)")
    # tokens an expert takes from each routing group (moe_group_size): capacity_factor *
    # group / num_experts (at least 4, as Mesh TensorFlow); the rest skip the FFN (residual)
    expert_capacity_factor: float = setting(1.25, bounds=(0.0, None))
    # the decoder's capacity factor in training / in eval (0 = expert_capacity_factor)
    decoder_expert_capacity_factor: float = setting(0.0, bounds=(0.0, None))
    decoder_expert_capacity_factor_eval: float = setting(0.0, bounds=(0.0, None))
    moe_aux_loss_weight: float = setting(0.01, bounds=(0.0, None))  # load-balancing loss
    # tokens a routing group holds at most: the batch's tokens, flattened, in the fewest equal
    # groups (Mesh TF's moe_group_size; the paper's gins 1024); 0 = each sequence a group
    moe_group_size: int = setting(0, bounds=(0, None))
    router_jitter: float = setting(0.0, bounds=(0.0, 1.0))  # multiplicative, training only
    # the fan-in init's scale of every FFN kernel: dense wi / wo, experts and router (Mesh TF's
    # global VarianceScalingInitializer.scale; its MoE / Switch gins set 0.1)
    ffn_init_scale: float = setting(1.0, bounds=(0.0, None))
    pkm_keys: int = setting(512, bounds=(1, None))  # sub-keys per half: pkm_keys**2 slots
    pkm_heads: int = setting(4, bounds=(1, None))
    pkm_knn: int = setting(32, bounds=(1, None))  # slots read per head
    pkm_key_dim: int = setting(512, bounds=(2, None))  # query width (two halves)
    # the encoder stack's norm ("" = norm): funnel_transformer.gin's Funnel encoder has RMS
    # norm layers where the decoder keeps the vanilla LayerNorm
    encoder_norm: str = setting("", choices=("", "rmsnorm", "layernorm", "none"))
    # Funnel Transformer encoder (models/funnel.py): layers per block, e.g. (4, 4, 4); each
    # later block mean-pools the sequence by 2 after its first self-attention; () = off
    funnel_blocks: tuple = ()
    # Weighted Transformer (models/weighted.py): branched attention, each head with its own
    # output projection, a shared FFN and learned kappa / alpha weights; no separate FFN
    weighted_transformer: bool = False
    # transparent attention (models/transparent.py): each decoder layer cross-attends to a
    # learned softmax-weighted sum of the embeddings and every encoder layer's output
    transparent_attention: bool = False
    # compute dtype; params are always float32
    dtype: str = setting("float32", choices=("float32", "bfloat16", "float16"))
    # Multi-axis projection kernels (attention query / key / value [D, H, K], out [H, K, D])
    # stored as [fan_in, fan_out] matrices and reshaped in the layer, as the T5 paper's Mesh
    # TensorFlow (attention combine_dims=True) and t5x store them. Adafactor then factors
    # their second moments over (fan_in, fan_out) as both do; as [D, H, K] they stayed
    # unfactored (second-largest dim K = 64 < min_dim_size_to_factor 128). And TPU tiles an
    # array's two minor dims by (8, 128): an fsdp-sharded [D/n, H, K] kernel with no dim of
    # 128 pads (its cost: bench/RESULTS.md). false = the layout of configs saved before the
    # field existed (LEGACY_VALUES): their checkpoints still restore.
    flat_kernels: bool = True
    scan_layers: bool = True
    # With scan_layers: layers per iteration of the compiled loop (lax.scan's unroll). 1 = one
    # loop body (fastest compile); k > 1 unrolls k layers per iteration; 0 = the whole stack.
    # Same parameter tree and numerics; unrolling skips the loop's per-layer slicing of params
    # and stacking of activations (faster for small models on CPU, slower to compile).
    scan_unroll: int = setting(1, bounds=(0, None))
    remat: str = setting("none", choices=("none", "minimal", "full"))
    # The gradient rules the model is traced with (models/gradient_rules.py): "cpu" gives a few
    # operations hand-written VJPs that XLA:CPU runs fast; "accelerator" keeps autodiff's form
    # and recomputes norms and activations in the backward pass (TPU, GPU); "auto" = the
    # default backend at trace time. Same numbers either way. The TPU compile path sets
    # "accelerator" (its host backend is the CPU). Configs saved before the field read "auto".
    gradient_rules: str = setting("auto", choices=("auto", "cpu", "accelerator"))
    # Attention: "xla" = logits + a [B, H, T, S] mask / position bias; "flash" = the Pallas
    # TPU kernel of models/flash_attention.py, which makes T5's relative bias (or ALiBi) and
    # the masks inside itself and never holds [T, S] in HBM (long inputs). Off TPU it runs in
    # Pallas interpret mode (same numbers, slow: for tests). GPU (models/gpu_attention.py):
    # "cudnn" = cuDNN's fused attention (bfloat16 / float16, head_dim a multiple of 8 <= 128);
    # "flash_gpu" = flash's Triton twin, the relative bias made in the kernel. "auto" = per
    # backend when traced: on a GPU cudnn where it covers the model, else flash_gpu, else xla;
    # elsewhere (CPU, TPU) xla; a run logs the pick. The kernels have no attention dropout,
    # prefix LM or PEFT prefix keys, and a named one that cannot run here is refused;
    # decoding with a KV cache uses "xla".
    attention_kernel: str = setting("xla", choices=("xla", "flash", "cudnn", "flash_gpu", "auto"))
    # Family details (defaults = T5). BERT/GPT-2 presets in t5lite/config/presets.py set them.
    embed_norm: bool = False  # norm after summing embeddings (BERT)
    scale_attn_logits: bool = False  # q.k / sqrt(head_dim); T5 folds it into the query init
    scale_tied_logits: bool = True  # T5 v1.0: decoder output * d_model**-0.5 before tied head
    # Mesh TF's VocabEmbedding.scale_variable_like_classifier_weights (Narang et al.'s Adam
    # rows, defaults_adam.gin): the token embedding starts N(0, 1 / width) and is multiplied
    # by sqrt(width) where it is looked up, so Adam's steps move it like the other weights;
    # the tied softmax reads it unscaled (scale_tied_logits=False)
    embed_like_classifier: bool = False
    # 0 = T5X init (fan-in dense, N(0,1) embeddings); >0 = N(0, std)
    init_std: float = setting(0.0, bounds=(0.0, None))
    # Whose fan-in initializers (with init_std 0; models/layers.py kernel_init, attention_init):
    # "t5x" = Flax's truncated normal with its std corrected for the truncation, the query's
    # std over sqrt(head_dim) where T5 folds the logits' scaling into it (as t5x); "mesh_tf" =
    # the T5 paper's and Narang et al.'s code: dense kernels TF's truncated_normal(sqrt(scale /
    # fan_in)), whose std the truncation shrinks by 0.88 (mesh_tensorflow/layers.py
    # VarianceScalingInitializer), attention projections an untruncated normal of std
    # fan_in^-1/2, the query's times head_dim^-1/2 (transformer/attention.py init_weights), and
    # the product key memory's as memory_layers.py. Only initial values change. The paper
    # scale of the ablation tables sets "mesh_tf".
    initializers: str = setting("t5x", choices=("t5x", "mesh_tf"))
    rope_max_wavelength: float = setting(10000.0, bounds=(1e-9, None))
    # Narang et al. 2021 rows (issue 38). The self-attention sub-layer's token mixer:
    # dot-product attention, a Synthesizer (models/synthesizer.py; its logits cover at most
    # max_length slots) or a lightweight / dynamic convolution (models/local_conv.py)
    attention_type: str = setting("multihead", choices=(
        "multihead", "synthesizer_dense", "synthesizer_dense_plus",
        "synthesizer_dense_plus_alpha", "synthesizer_factorized", "synthesizer_random",
        "synthesizer_random_plus", "synthesizer_random_plus_alpha", "lightweight_conv",
        "dynamic_conv"))
    synthesizer_rank: int = setting(16, bounds=(1, None))  # factorized: R1, R2 [rank, H, L]
    # convolution taps: centred in an encoder, ending at the query in a decoder
    conv_kernel_size: int = setting(9, bounds=(1, None))
    # distinct convolution kernels, each shared by d_model / conv_heads consecutive channels
    # (Wu et al.'s weight tying); 0 = one kernel per channel
    conv_heads: int = setting(0, bounds=(0, None))
    # "evolved": Evolved Transformer blocks (models/evolved.py; one stands for two layers)
    block_type: str = setting("transformer", choices=("transformer", "evolved"))
    # the decoder's output layer (models/vocab_layers.py): one tied softmax, the adaptive
    # softmax over vocab_clusters, or a mixture of mos_components softmaxes
    output_softmax: str = setting("softmax", choices=("softmax", "adaptive", "mixture"))
    adaptive_input: bool = False  # adaptive input embeddings over vocab_clusters
    # ((token_count, embedding_size), ...) over consecutive ids, most frequent first; the
    # counts sum to vocab_size; size 0 = d_model
    vocab_clusters: tuple = ()
    mos_components: int = setting(15, bounds=(1, None))
    # Narang et al. 2021's modifications (models/residual.py, models/embeddings.py):
    # ReZero: each residual branch times a learned scalar that starts at 0 (Bachlechner et al.)
    rezero: bool = False
    # Fixup (Zhang et al. 2019): with norm="none", scalar shift before and scale after each
    # branch, the branches' last projections start at zero, the others' He init is scaled
    # by (number of residual branches) ** -1/2
    fixup: bool = False
    # ALBERT block sharing: one set of layer weights used at every layer of the stack
    share_encoder_block: bool = False
    share_decoder_block: bool = False
    # Universal Transformer: a shared block applied this many times (0 = the stack's layers),
    # with a learned embedding of the step added before each application
    universal_steps: int = setting(0, bounds=(0, None))
    # ... as Mesh TF's UTLayerStack (models/sharing.py): also applied this many times before and
    # after the steps (no step embedding), and each sub-layer's output GRU-gated ("gru")
    universal_mix_layers: int = setting(0, bounds=(0, None))
    universal_gating: str = setting("none", choices=("none", "gru"))
    # ALBERT factorized embedding: token embedding [V, E] then [E, d_model] (0 = off); the
    # tied softmax goes back through both
    factorized_embed_dim: int = setting(0, bounds=(0, None))
    # encoder and decoder read one input embedding (T5); False = one each
    tie_encoder_decoder_embeddings: bool = True
    peft: PeftConfig = dataclasses.field(default_factory=PeftConfig)
    electra: ElectraConfig = dataclasses.field(default_factory=ElectraConfig)
