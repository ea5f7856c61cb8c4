"""The config's typed sections: every field with its default, its allowed values (choices or
range, beside the field) and what it means.

Every section refuses an assignment to a name that is not one of its fields (a typo in a config
file, ``cfg.train.stpes = 20``, would otherwise be ignored silently), and any assignment once
the config is frozen (load_config freezes what it validated; derive a changed one with
config.replace).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Optional

from t5lite.errors import UserError

FROZEN_MESSAGE = ("cannot set {key}: the config is frozen after validation. Pass overrides "
                  "to load_config(name, [\"{key}=...\"]) or derive a changed copy with "
                  "t5lite.config.replace(cfg, {{\"{key}\": ...}})")


def setting(default, *, choices: tuple = (), bounds: tuple = (None, None), meaning: str = ""):
    """A field whose rules sit beside it: ``choices`` (the allowed values), ``bounds`` ((low,
    high), both inclusive, None = unbounded) and ``meaning`` (what 0 / -1 mean, for the error
    message). config.rules.check_fields reads them."""
    return dataclasses.field(default=default, metadata={"choices": choices, "range": bounds,
                                                        "meaning": meaning})


@functools.cache
def field_names(cls) -> frozenset:
    return frozenset(f.name for f in dataclasses.fields(cls))


class Section:
    """Base of every config section: assignments only to known fields, and none when frozen;
    reading a name that is not a field (``cfg.trian.steps``) says which field was meant."""

    def __setattr__(self, name, value):
        pre = _prefix(type(self))
        if name not in field_names(type(self)):
            raise unknown_key(type(self), name)
        if self.__dict__.get("_frozen"):
            raise UserError(FROZEN_MESSAGE.format(key=pre + name))
        object.__setattr__(self, name, value)

    def __getattr__(self, name):  # only for names that are not attributes
        if name.startswith("_"):  # copy / pickle / hasattr probes
            raise AttributeError(name)
        raise unknown_key(type(self), name)


def _prefix(cls) -> str:
    prefix = SECTION_PATHS.get(cls, "")
    return prefix + "." if prefix else ""


def unknown_key(cls, name: str) -> "UnknownKeyError":
    """The error for ``name``, not a field of section ``cls``, with the closest fields."""
    pre = _prefix(cls)
    known = [pre + n for n in field_names(cls)]
    hint = difflib.get_close_matches(pre + name, known, n=3, cutoff=0.5)
    return UnknownKeyError(f"unknown config key {pre + name!r}." + (
        f" Did you mean: {', '.join(hint)}?" if hint else
        f" {cls.__name__} has: {', '.join(sorted(known))}"))


def freeze(section: Section) -> None:
    """Refuse every later assignment to ``section`` and the sections inside it (in place)."""
    object.__setattr__(section, "_frozen", True)
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, Section):
            freeze(value)


def is_frozen(section: Section) -> bool:
    return bool(section.__dict__.get("_frozen"))


class UnknownKeyError(UserError, AttributeError):
    """A config field that does not exist, assigned or read (load_config adds the file:line);
    an AttributeError too, so getattr(section, name, default) and hasattr keep working."""


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
                                        "reglu", "swiglu", "bilinear"))
    norm: str = setting("rmsnorm", choices=("rmsnorm", "layernorm"))
    norm_eps: float = setting(1e-6, bounds=(0.0, None))
    pre_norm: bool = True  # False = post-norm (BERT)
    position: str = setting("relative", choices=("relative", "learned", "sinusoidal", "rope",
                                                 "alibi"))
    max_length: int = setting(512, bounds=(1, None))  # table size for learned positions
    relative_buckets: int = setting(32, bounds=(1, None))
    relative_max_distance: int = setting(128, bounds=(1, None))
    tie_embeddings: bool = True  # output projection = input embedding transposed
    use_bias: bool = False  # biases in dense layers (BERT, GPT-2)
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
    # Family details (defaults = T5). BERT/GPT-2 presets in t5lite/config/presets.py set them.
    embed_norm: bool = False  # norm after summing embeddings (BERT)
    scale_attn_logits: bool = False  # q.k / sqrt(head_dim); T5 folds it into the query init
    scale_tied_logits: bool = True  # T5 v1.0: decoder output * d_model**-0.5 before tied head
    # 0 = T5X init (fan-in dense, N(0,1) embeddings); >0 = N(0, std)
    init_std: float = setting(0.0, bounds=(0.0, None))
    rope_max_wavelength: float = setting(10000.0, bounds=(1e-9, None))
    peft: PeftConfig = dataclasses.field(default_factory=PeftConfig)
    electra: ElectraConfig = dataclasses.field(default_factory=ElectraConfig)


@dataclasses.dataclass
class DataConfig(Section):
    mixture_or_task: str = "corpus_span_corruption"
    # feature lengths by task feature: {"inputs": 512, "targets": 114} (enc-dec),
    # {"targets": 512} (decoder LM), {"inputs": 512} (encoder / BERT).
    feature_lengths: dict = dataclasses.field(
        default_factory=lambda: {"inputs": 512, "targets": 114})
    # global batch, across all processes and devices
    batch_size: int = setting(128, bounds=(1, None))
    pack: bool = True
    shuffle: bool = True
    seed: int = setting(0, bounds=(0, None))
    train_split: str = "train"
    eval_split: str = "validation"
    data_dir: str = ""  # where prepared data lives; "" = $T5LITE_DATA_DIR or ~/.cache/t5lite
    # your modules that register seqio tasks / mixtures, imported before the task lookup (also
    # by eval / infer, from the saved config): "my_tasks" (importable from the current
    # directory) or a path "path/to/my_tasks.py"
    task_modules: tuple = ()
    # training data is read as this many seqio shards (tasks/pipeline.py ShardedBatches), so a
    # run can resume on any process count that divides it or that it divides; 0 = the process
    # count of the run that started the workdir. Set it to the largest slice you may grow to.
    num_shards: int = setting(0, bounds=(0, None))
    # read the tasks' preprocessed data from `t5lite data cache` (seqio's cache format) in
    # cache_dir ("" = <data dir>/seqio_cache) instead of tokenizing on the fly
    use_cached: bool = False
    cache_dir: str = ""


@dataclasses.dataclass
class OptimizerConfig(Section):
    name: str = setting("adafactor", choices=("adafactor", "adamw", "adamw_rms_scaled"))
    learning_rate: float = setting(1e-2, bounds=(0.0, None))  # peak
    schedule: str = setting("rsqrt", choices=("rsqrt", "constant", "cosine", "linear"))
    warmup_steps: int = setting(1000, bounds=(0, None))
    weight_decay: float = setting(0.0, bounds=(0.0, None))
    b1: float = setting(0.9, bounds=(0.0, 1.0))
    b2: float = setting(0.999, bounds=(0.0, 1.0))
    eps: float = setting(1e-8, bounds=(0.0, None))
    clip_grad_norm: float = setting(0.0, bounds=(0.0, None))  # 0 = off
    # floor for cosine / linear decay
    min_lr_ratio: float = setting(0.0, bounds=(0.0, 1.0))


@dataclasses.dataclass
class TrainConfig(Section):
    steps: int = setting(1000, bounds=(0, None))
    seed: int = setting(0, bounds=(0, None))
    grad_accum_steps: int = setting(1, bounds=(1, None))
    z_loss: float = setting(1e-4, bounds=(0.0, None))
    label_smoothing: float = setting(0.0, bounds=(0.0, 0.999))
    # T5: e.g. 233472; None = num real targets
    loss_normalizing_factor: Optional[float] = setting(None, bounds=(1e-9, None))
    # decoder-only classification: + this * next-token LM loss on the inputs (GPT-1: 0.5)
    aux_lm_weight: float = setting(0.0, bounds=(0.0, None))
    # log_every >= 1: 0 would fail only after minutes of compiling
    log_every: int = setting(10, bounds=(1, None))
    eval_every: int = setting(0, bounds=(0, None), meaning=" (0 = only at the end)")
    eval_steps: int = setting(10, bounds=(0, None))
    stop_on_nan: bool = True
    # per-device peak FLOP/s for MFU; 0 = look up the device (none on CPU)
    peak_flops: float = setting(0.0, bounds=(0.0, None))
    # local datasets built before training if missing (dataprep.ensure_prepared), e.g.
    # ("corpus", "vocab_sp8k"); () = expect them prepared (`t5lite data prepare`)
    prepare_data: tuple = ()
    # "A:B": jax.profiler trace of the steps after A up to B into WORKDIR/profile/ (process 0)
    profile_steps: str = ""
    # Restart-and-skip after a loss spike (PaLM): "S:N" = when the run resumes at step S,
    # discard the next N training batches before training on. A run that starts at any other
    # step (a later checkpoint already holds the data position past them) skips nothing.
    skip_batches: str = ""
    # Weights & Biases (pip install wandb): log the metrics to this project too, beside
    # TensorBoard and metrics.jsonl (process 0; one W&B run per workdir); "" = off
    wandb_project: str = ""
    wandb_entity: str = ""  # "" = your default entity
    # "" = W&B's own choice ($WANDB_MODE, else online); offline: files in WORKDIR/wandb only
    wandb_mode: str = setting("", choices=("", "online", "offline"))


@dataclasses.dataclass
class MeshConfig(Section):
    data: int = -1  # -1 = all remaining devices
    fsdp: int = 1
    tensor: int = 1
    # XLA:TPU's collective matmuls ("windowed einsum": a sharded matmul as a loop over shards,
    # each step a partial product accumulated in HBM). Off: the weights are all-gathered and
    # multiplied once, as MaxText's dense configs do; the compiled T5 v1.1 XL step on v5p-64
    # moves fewer HBM bytes that way (bench/RESULTS.md). TPU only.
    collective_matmul: bool = False
    multihost: bool = False  # call jax.distributed.initialize()
    coordinator_address: str = ""  # "" = discover (TPU / SLURM) or env vars
    num_processes: int = setting(0, bounds=(0, None))
    process_id: int = setting(-1, bounds=(-1, None), meaning=" (-1 = discover)")


@dataclasses.dataclass
class CheckpointConfig(Section):
    every_steps: int = setting(500, bounds=(0, None), meaning=" (0 = only at the last step)")
    keep: int = setting(3, bounds=(0, None), meaning=" (0 = all)")
    async_save: bool = True
    # Start from these params (partial restore, e.g. finetuning from a pretrained run):
    init_from: str = ""
    init_step: int = setting(-1, bounds=(-1, None), meaning=" (-1 = latest)")
    # also continue init_from's step count and optimizer state, as T5's finetuning did
    # (train.steps then counts the pretraining steps too); needs a training workdir
    init_state: bool = False
    # gs:// workdirs: WORKDIR/.lock of a run that has not refreshed it for this long is
    # taken over (its heartbeat is every lease / 6); local disks use flock instead
    lock_lease_seconds: float = setting(180.0, bounds=(10.0, None))


@dataclasses.dataclass
class EvalConfig(Section):
    """seqio evaluation (task metric_fns over decoded predictions / scores) during training."""

    tasks: tuple = ()  # seqio tasks or mixtures to evaluate; () = data.mixture_or_task
    # 0 = only at the end of training (when tasks or best_metric is set)
    every_steps: int = setting(0, bounds=(0, None))
    split: str = "validation"
    max_examples: int = setting(0, bounds=(0, None))  # per task; 0 = all
    batch_size: int = setting(32, bounds=(1, None))  # examples per decoding batch
    best_metric: str = ""  # e.g. "sentiment/accuracy": keep the best params in workdir/best
    best_mode: str = setting("max", choices=("max", "min"))
    vocabulary: str = ""  # infer: vocabulary for raw text ("" = data.mixture_or_task's)


@dataclasses.dataclass
class DecodeConfig(Section):
    """How predictions are generated (decoding.py): greedy, beam search, or sampling."""

    method: str = setting("greedy", choices=("greedy", "beam", "sample", "self_consistency"))
    beams: int = setting(4, bounds=(1, None))
    # beam length penalty ((5 + len) / 6) ** alpha (GNMT / T5); 0 = none
    alpha: float = setting(0.6, bounds=(0.0, None))
    temperature: float = setting(1.0, bounds=(0.0, None))  # sample: 0 = greedy
    # sample: keep the k most likely tokens; 0 = all
    top_k: int = setting(0, bounds=(0, None))
    top_p: float = setting(1.0, bounds=(1e-9, 1.0))  # sample: nucleus mass; 1.0 = all
    max_length: int = setting(64, bounds=(1, None))  # new tokens per example (EOS included)
    seed: int = setting(0, bounds=(0, None))
    # self_consistency: answers sampled per input, then majority-voted
    num_samples: int = setting(1, bounds=(1, None))


@dataclasses.dataclass
class Config(Section):
    name: str = "t5lite"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)


def _section_paths(cls, prefix: str = "") -> dict:
    """{section class: its dotted path in a Config}, e.g. PeftConfig -> "model.peft"."""
    paths = {cls: prefix}
    for f in dataclasses.fields(cls):
        if isinstance(f.default_factory, type) and issubclass(f.default_factory, Section):
            paths.update(_section_paths(f.default_factory, prefix + "." * bool(prefix) + f.name))
    return paths


SECTION_PATHS = _section_paths(Config)
