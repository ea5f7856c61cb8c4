"""Typed experiment config: dataclasses, config files, dotted CLI overrides, validation.

A config file is a Python file under configs/ that defines ``get_config() -> Config``.
Overrides are ``section.field=value`` strings (``--set train.steps=100``); values are parsed as
Python literals and checked against the field's type. Unknown keys fail with a suggestion.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import os
import typing
from typing import Any, Optional

from t5lite import pyfiles
from t5lite.errors import UserError


@dataclasses.dataclass
class PeftConfig:
    """Parameter-efficient finetuning (t5lite/models/peft.py). All off by default.

    With any method on and ``train_only_peft``, only the PEFT params and ``train_also`` (new
    task heads) are trained; the optimizer allocates no state for the rest.
    """

    lora_rank: int = 0  # 0 = no LoRA
    lora_alpha: float = 16.0  # LoRA update scaled by lora_alpha / lora_rank
    # DenseGeneral module names (globs) that get LoRA: query key value out wi wi_0 wi_1 wo
    lora_targets: tuple = ("query", "value")
    prompt_tokens: int = 0  # prompt tuning: N soft tokens prepended to the (encoder) input
    prefix_tokens: int = 0  # prefix tuning: N learned key/value vectors per self-attention
    adapter_dim: int = 0  # bottleneck adapters after attention and MLP (0 = off)
    ia3: bool = False  # (IA)^3 scaling of keys, values and MLP hidden
    freeze: tuple = ()  # glob patterns of parameter paths kept frozen, e.g. ("encoder/*",)
    train_only_peft: bool = True  # with any PEFT option on, freeze everything else ...
    # ... except these (globs over param paths): freshly initialised task heads
    train_also: tuple = ("class_dense/*", "token_dense/*", "span_dense/*")
    # gradual unfreezing (T5 paper 3.5.1): train heads + the top `unfreeze_layers` layers of
    # encoder and decoder (in parallel), open `unfreeze_layers` more every `unfreeze_every`
    # steps; input embeddings with the bottom layer, a tied one throughout. 0 = off.
    unfreeze_every: int = 0
    unfreeze_layers: int = 1
    save_peft_params: bool = True  # write workdir/peft/<step>/ (PEFT params only) on save


@dataclasses.dataclass
class ElectraConfig:
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
class ModelConfig:
    """One config for all three families; variants are fields, not subclasses."""

    # encoder_decoder | decoder_only | prefix_lm | encoder_only
    architecture: str = "encoder_decoder"
    shared_encoder_decoder: bool = False  # paper's "shared": one set of layer weights
    vocab_size: int = 32128
    d_model: int = 512
    num_heads: int = 8
    head_dim: int = 64
    d_ff: int = 2048
    # width of the token / position / token-type embeddings (ALBERT / ELECTRA factorisation,
    # HF embedding_size): 0 = d_model; else a dense embed_project maps it to d_model
    embed_dim: int = 0
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    # relu | gelu | gelu_tanh | silu | glu | geglu | reglu | swiglu | bilinear
    ffn: str = "relu"
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    norm_eps: float = 1e-6
    pre_norm: bool = True  # False = post-norm (BERT)
    # relative | learned | sinusoidal | rope | alibi
    position: str = "relative"
    max_length: int = 512  # table size for learned positions
    relative_buckets: int = 32
    relative_max_distance: int = 128
    tie_embeddings: bool = True  # output projection = input embedding transposed
    use_bias: bool = False  # biases in dense layers (BERT, GPT-2)
    num_token_types: int = 0  # BERT segment (token type) embeddings
    nsp_head: bool = False  # BERT next-sentence prediction head (implies pooler)
    pooler: bool = False
    # convert.py export target when the architecture has several: "RobertaForMaskedLM"
    # (RoBERTa: BERT layers, positions offset by padding_idx + 1); "" = by architecture
    hf_class: str = ""
    num_classes: int = 0  # >0 adds a classification head (see heads in architectures.py)
    num_token_classes: int = 0  # >0: per-token tagging head (BIO), "token_logits" [B, L, C]
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
    dtype: str = "float32"  # compute dtype; params are always float32
    # Multi-axis projection kernels (attention query / key / value [D, H, K], out [H, K, D])
    # stored as [fan_in, fan_out] matrices and reshaped in the layer, as the T5 paper's Mesh
    # TensorFlow (attention combine_dims=True) and t5x store them. Adafactor then factors
    # their second moments over (fan_in, fan_out) as both do; as [D, H, K] they stayed
    # unfactored (second-largest dim K = 64 < min_dim_size_to_factor 128). And TPU tiles an
    # array's two minor dims by (8, 128): an fsdp-sharded [D/n, H, K] kernel with no dim of
    # 128 pads (T5 v1.1 XL on v5p-64: 2.34 -> 1.79 GiB a chip, bench/RESULTS.md). false = the
    # layout of configs saved before the field existed (LEGACY_VALUES): their checkpoints
    # still restore.
    flat_kernels: bool = True
    scan_layers: bool = True
    # With scan_layers: layers per iteration of the compiled loop (lax.scan's unroll). 1 = one
    # loop body (fastest compile); k > 1 unrolls k layers per iteration; 0 = the whole stack.
    # Same parameter tree and numerics; unrolling skips the loop's per-layer slicing of params
    # and stacking of activations (faster for small models on CPU, slower to compile).
    scan_unroll: int = 1
    remat: str = "none"  # none | minimal | full
    # Family details (defaults = T5). BERT/GPT-2 presets in t5lite/models/presets.py set them.
    embed_norm: bool = False  # norm after summing embeddings (BERT)
    scale_attn_logits: bool = False  # q.k / sqrt(head_dim); T5 folds it into the query init
    scale_tied_logits: bool = True  # T5 v1.0: decoder output * d_model**-0.5 before tied head
    init_std: float = 0.0  # 0 = T5X init (fan-in dense, N(0,1) embeddings); >0 = N(0, std)
    rope_max_wavelength: float = 10000.0
    peft: PeftConfig = dataclasses.field(default_factory=PeftConfig)
    electra: ElectraConfig = dataclasses.field(default_factory=ElectraConfig)


@dataclasses.dataclass
class DataConfig:
    mixture_or_task: str = "corpus_span_corruption"
    # feature lengths by task feature: {"inputs": 512, "targets": 114} (enc-dec),
    # {"targets": 512} (decoder LM), {"inputs": 512} (encoder / BERT).
    feature_lengths: dict = dataclasses.field(
        default_factory=lambda: {"inputs": 512, "targets": 114})
    batch_size: int = 128  # global batch, across all processes and devices
    pack: bool = True
    shuffle: bool = True
    seed: int = 0
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
    num_shards: int = 0
    # read the tasks' preprocessed data from `t5lite data cache` (seqio's cache format) in
    # cache_dir ("" = <data dir>/seqio_cache) instead of tokenizing on the fly
    use_cached: bool = False
    cache_dir: str = ""


@dataclasses.dataclass
class OptimizerConfig:
    name: str = "adafactor"  # adafactor | adamw | adamw_rms_scaled
    learning_rate: float = 1e-2  # peak
    schedule: str = "rsqrt"  # rsqrt | constant | cosine | linear
    warmup_steps: int = 1000
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_grad_norm: float = 0.0  # 0 = off
    min_lr_ratio: float = 0.0  # floor for cosine / linear decay


@dataclasses.dataclass
class TrainConfig:
    steps: int = 1000
    seed: int = 0
    grad_accum_steps: int = 1
    z_loss: float = 1e-4
    label_smoothing: float = 0.0
    loss_normalizing_factor: Optional[float] = None  # T5: e.g. 233472; None = num real targets
    # decoder-only classification: + this * next-token LM loss on the inputs (GPT-1: 0.5)
    aux_lm_weight: float = 0.0
    log_every: int = 10
    eval_every: int = 0  # 0 = only at the end
    eval_steps: int = 10
    stop_on_nan: bool = True
    peak_flops: float = 0.0  # per-device peak FLOP/s for MFU; 0 = look up the device (none on CPU)
    # local datasets built before training if missing (dataprep.ensure_prepared), e.g.
    # ("corpus", "vocab_sp8k"); () = expect them prepared (`t5lite data prepare`)
    prepare_data: tuple = ()
    # "A:B": jax.profiler trace of the steps after A up to B into WORKDIR/profile/ (process 0)
    profile_steps: str = ""


@dataclasses.dataclass
class MeshConfig:
    data: int = -1  # -1 = all remaining devices
    fsdp: int = 1
    tensor: int = 1
    # XLA:TPU's collective matmuls ("windowed einsum": a sharded matmul as a loop over shards,
    # each step a partial product accumulated in HBM). Off: the weights are all-gathered and
    # multiplied once, as MaxText's dense configs do; the compiled T5 v1.1 XL step on v5p-64
    # moves ~2x fewer HBM bytes that way (bench/RESULTS.md). TPU only.
    collective_matmul: bool = False
    multihost: bool = False  # call jax.distributed.initialize()
    coordinator_address: str = ""  # "" = discover (TPU / SLURM) or env vars
    num_processes: int = 0
    process_id: int = -1


@dataclasses.dataclass
class CheckpointConfig:
    every_steps: int = 500
    keep: int = 3
    async_save: bool = True
    # Start from these params (partial restore, e.g. finetuning from a pretrained run):
    init_from: str = ""
    init_step: int = -1  # -1 = latest
    # gs:// workdirs: WORKDIR/.lock of a run that has not refreshed it for this long is
    # taken over (its heartbeat is every lease / 6); local disks use flock instead
    lock_lease_seconds: float = 180.0


@dataclasses.dataclass
class EvalConfig:
    """seqio evaluation (task metric_fns over decoded predictions / scores) during training."""

    tasks: tuple = ()  # seqio tasks or mixtures to evaluate; () = data.mixture_or_task
    every_steps: int = 0  # 0 = only at the end of training (when tasks or best_metric is set)
    split: str = "validation"
    max_examples: int = 0  # per task; 0 = all
    batch_size: int = 32  # examples per decoding batch
    best_metric: str = ""  # e.g. "sentiment/accuracy": keep the best params in workdir/best
    best_mode: str = "max"
    vocabulary: str = ""  # infer: vocabulary for raw text ("" = data.mixture_or_task's)


@dataclasses.dataclass
class DecodeConfig:
    """How predictions are generated (decoding.py): greedy, beam search, or sampling."""

    method: str = "greedy"  # greedy | beam | sample | self_consistency
    beams: int = 4
    alpha: float = 0.6  # beam length penalty ((5 + len) / 6) ** alpha (GNMT / T5); 0 = none
    temperature: float = 1.0  # sample: 0 = greedy
    top_k: int = 0  # sample: keep the k most likely tokens; 0 = all
    top_p: float = 1.0  # sample: nucleus mass; 1.0 = all
    max_length: int = 64  # new tokens per example (EOS included)
    seed: int = 0
    num_samples: int = 1  # self_consistency: answers sampled per input, then majority-voted


@dataclasses.dataclass
class Config:
    name: str = "t5lite"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)


# ----------------------------------------------------------------------------- loading


def configs_dir() -> str:
    """The repository's configs/ folder (also found when running from an installed copy)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(here, "configs")


def resolve_config_path(path: str) -> str:
    """Accept 'configs/x.py', an absolute path, or a bare name like 'quickstart'."""
    candidates = [path, os.path.join(configs_dir(), path),
                  os.path.join(configs_dir(), path + ".py")]
    if path.startswith("configs/"):
        candidates.append(os.path.join(configs_dir(), path[len("configs/"):]))
    for c in candidates:
        if os.path.isfile(c):
            return c
    known = sorted(available_configs())
    hint = difflib.get_close_matches(os.path.basename(path).removesuffix(".py"), known, n=3)
    raise UserError(f"config file {path!r} not found."
                    + (f" Did you mean: {', '.join(hint)}?" if hint else "")
                    + " Run `t5lite models` to list the configs.")


def available_configs() -> list[str]:
    """Names of config files under configs/ (recursively), without '.py'."""
    names = []
    root = configs_dir()
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and not f.startswith("_"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                names.append(rel[:-3])
    return names


def load_config(path: str, overrides: typing.Sequence[str] = ()) -> Config:
    """Load ``get_config()`` from a config file and apply ``key=value`` overrides."""
    file = resolve_config_path(path)
    try:
        module = pyfiles.load(file, "t5lite_config_" + os.path.basename(file)[:-3])
        if not hasattr(module, "get_config"):
            raise UserError(f"{file} must define get_config() returning t5lite.config.Config.")
        cfg = module.get_config()
    except UserError:
        raise
    except SyntaxError as e:
        raise UserError(f"{e.filename or file}:{e.lineno}: syntax error in the config file: "
                        f"{e.msg}. Fix that line.") from None
    except Exception as e:  # noqa: BLE001 - NameError, ImportError ... inside the config file
        raise UserError(f"{_error_location(e, file)}: {type(e).__name__}: {e}. Fix the config "
                        "file there.") from None
    if not isinstance(cfg, Config):
        raise UserError(f"get_config() in {file} returned {type(cfg).__name__}, not Config.")
    cfg = apply_overrides(cfg, overrides)
    validate(cfg)
    return cfg


def cpu_recipe(base: str, name: str, steps: int, every: int, log_every: int = 10) -> Config:
    """What the configs/tiny_*.py runs share (a few minutes on a laptop CPU): config `base`
    (a model config), AdamW (50 warmup steps, weight decay 0.01), batch 32, no z-loss,
    `steps` steps, an eval and a checkpoint every `every` steps. The caller sets the task,
    lengths, learning rate and schedule."""
    cfg = load_config(base)
    cfg.name = name
    cfg.data.batch_size = 32
    cfg.optim.name, cfg.optim.warmup_steps, cfg.optim.weight_decay = "adamw", 50, 0.01
    cfg.train.steps, cfg.train.z_loss, cfg.train.log_every = steps, 0.0, log_every
    cfg.train.eval_every = cfg.checkpoint.every_steps = every
    return cfg


def _error_location(err: BaseException, file: str) -> str:
    """'path:line' of the innermost traceback frame inside a config file (the one named, or a
    config file it imports), else the file."""
    import traceback
    frames = traceback.extract_tb(err.__traceback__)
    root = os.path.dirname(os.path.abspath(file))
    inside = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(file)
              or os.path.abspath(f.filename).startswith(configs_dir() + os.sep)
              or os.path.dirname(os.path.abspath(f.filename)) == root]
    if inside:
        return f"{inside[-1].filename}:{inside[-1].lineno}"
    return file


def apply_overrides(cfg: Config, overrides: typing.Sequence[str]) -> Config:
    cfg = copy_config(cfg)
    for item in overrides:
        if "=" not in item:
            raise UserError(f"override {item!r} must look like section.field=value, "
                            "e.g. train.steps=100")
        key, raw = item.split("=", 1)
        set_by_path(cfg, key.strip(), raw.strip())
    return cfg


def copy_config(cfg):
    return dataclasses.replace(cfg, **{
        f.name: copy_config(getattr(cfg, f.name)) if dataclasses.is_dataclass(
            getattr(cfg, f.name)) else _copy_value(getattr(cfg, f.name))
        for f in dataclasses.fields(cfg)})


def _copy_value(v):
    return dict(v) if isinstance(v, dict) else v


def _all_keys(obj, prefix="") -> list[str]:
    keys = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            keys += _all_keys(v, prefix + f.name + ".")
        else:
            keys.append(prefix + f.name)
    return keys


def set_by_path(cfg: Config, key: str, raw: Any) -> None:
    """Set ``a.b.c`` on cfg; ``raw`` is a string (parsed) or an already-typed value."""
    parts = key.split(".")
    obj = cfg
    for i, part in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(
            obj) else {}
        is_dict_entry = isinstance(obj, dict)
        if not is_dict_entry and part not in names:
            suggestions = difflib.get_close_matches(key, _all_keys(cfg), n=3, cutoff=0.5)
            raise UserError(f"unknown config key {key!r}." + (
                f" Did you mean: {', '.join(suggestions)}?" if suggestions else
                " Valid sections: " + ", ".join(f.name for f in dataclasses.fields(cfg))))
        last = i == len(parts) - 1
        if not last:
            obj = obj[part] if is_dict_entry else getattr(obj, part)
            continue
        if is_dict_entry:
            obj[part] = _parse(raw)
        else:
            hints = typing.get_type_hints(type(obj))
            setattr(obj, part, _coerce(raw, hints[part], key))


def _parse(raw):
    """A --set value as a Python literal when it is one, else the string itself (the caller's
    type check, _coerce, says what is wrong)."""
    if not isinstance(raw, str):
        return raw
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def _coerce(raw, hint, key):
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union and type(None) in args:  # Optional[X]
        if raw in (None, "None", "none", "null"):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is str:
        return raw if isinstance(raw, str) else str(raw)
    value = _parse(raw)
    if hint is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise UserError(f"{key} must be true or false, got {raw!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{key} must be an integer, got {raw!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{key} must be a number, got {raw!r}")
        return float(value)
    if hint is tuple or origin is tuple:
        if isinstance(value, str):
            value = tuple(v for v in value.split(",") if v)
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{key} must be a list like a,b or ('a','b'), got {raw!r}")
        return tuple(value)
    if hint is dict or origin is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        if not isinstance(value, dict):
            raise UserError(f"{key} must be a dict like {{'inputs': 512}}, got {raw!r}")
        return value
    return value


CHOICES = {
    "model.architecture": ("encoder_decoder", "decoder_only", "prefix_lm", "encoder_only"),
    "model.ffn": ("relu", "gelu", "gelu_tanh", "silu", "glu", "geglu", "reglu", "swiglu",
                  "bilinear"),
    "model.norm": ("rmsnorm", "layernorm"),
    "model.position": ("relative", "learned", "sinusoidal", "rope", "alibi"),
    "model.remat": ("none", "minimal", "full"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "optim.name": ("adafactor", "adamw", "adamw_rms_scaled"),
    "optim.schedule": ("rsqrt", "constant", "cosine", "linear"),
    "eval.best_mode": ("max", "min"),
    "decode.method": ("greedy", "beam", "sample", "self_consistency"),
}


def get_by_path(cfg, key):
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


# Allowed range of every numeric field: (low, high), both inclusive; None = unbounded. Checked
# at load, so a nonsense value fails in a second with its name, never after minutes of
# compiling (log_every=0) or as a silent no-op (negative steps). Every float must be finite.
RANGES = {
    "model.vocab_size": (1, None), "model.d_model": (1, None), "model.num_heads": (1, None),
    "model.head_dim": (1, None), "model.d_ff": (1, None), "model.num_encoder_layers": (0, None),
    "model.num_decoder_layers": (0, None), "model.norm_eps": (0.0, None),
    "model.max_length": (1, None), "model.relative_buckets": (1, None),
    "model.relative_max_distance": (1, None), "model.num_token_types": (0, None),
    "model.num_classes": (0, None), "model.num_token_classes": (0, None),
    "model.scan_unroll": (0, None), "model.init_std": (0.0, None),
    "model.rope_max_wavelength": (1e-9, None),
    "model.peft.lora_rank": (0, None), "model.peft.prompt_tokens": (0, None),
    "model.peft.prefix_tokens": (0, None), "model.peft.adapter_dim": (0, None),
    "model.peft.unfreeze_every": (0, None), "model.peft.unfreeze_layers": (1, None),
    "data.batch_size": (1, None), "data.seed": (0, None), "data.num_shards": (0, None),
    "optim.learning_rate": (0.0, None), "optim.warmup_steps": (0, None),
    "optim.weight_decay": (0.0, None), "optim.b1": (0.0, 1.0), "optim.b2": (0.0, 1.0),
    "optim.eps": (0.0, None), "optim.clip_grad_norm": (0.0, None),
    "optim.min_lr_ratio": (0.0, 1.0),
    "train.steps": (0, None), "train.seed": (0, None), "train.grad_accum_steps": (1, None),
    "train.z_loss": (0.0, None), "train.label_smoothing": (0.0, 0.999),
    "train.loss_normalizing_factor": (1e-9, None), "train.log_every": (1, None),
    "train.eval_every": (0, None), "train.eval_steps": (0, None), "train.peak_flops": (0.0, None),
    "mesh.num_processes": (0, None), "mesh.process_id": (-1, None),
    "checkpoint.every_steps": (0, None), "checkpoint.keep": (0, None),
    "checkpoint.init_step": (-1, None), "checkpoint.lock_lease_seconds": (10.0, None),
    "eval.every_steps": (0, None), "eval.max_examples": (0, None), "eval.batch_size": (1, None),
    "decode.beams": (1, None), "decode.alpha": (0.0, None), "decode.temperature": (0.0, None),
    "decode.top_k": (0, None), "decode.top_p": (1e-9, 1.0), "decode.max_length": (1, None),
    "decode.seed": (0, None), "decode.num_samples": (1, None), "train.aux_lm_weight": (0.0, None),
}
MEANING = {  # what 0 / -1 mean, for the error message
    "checkpoint.every_steps": " (0 = only at the last step)", "checkpoint.keep": " (0 = all)",
    "train.eval_every": " (0 = only at the end)", "checkpoint.init_step": " (-1 = latest)",
    "mesh.process_id": " (-1 = discover)", "train.steps": "",
}


def check_fields(obj, prefix: str = "") -> None:
    """The one home of single-field rules: every field of ``obj`` (a Config, or one section
    such as a DecodeConfig with prefix "decode") against CHOICES, RANGES and finiteness.
    decoding.check / models.check call it for the section they get, so a config built in
    Python (not loaded from a file) meets the same rules."""
    import math
    pre = prefix + "." if prefix else ""
    for key in _all_keys(obj):
        value, full = get_by_path(obj, key), pre + key
        if full in CHOICES:
            choices = CHOICES[full]
            if value not in choices:
                hint = difflib.get_close_matches(str(value), choices, n=1)
                raise UserError(f"{full}={value!r} is not one of {', '.join(choices)}."
                                + (f" Did you mean {hint[0]!r}?" if hint else ""))
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{full}={value} is not a finite number; give a finite value "
                            f"(the default is {get_by_path(_DEFAULT, full)})")
        lo, hi = RANGES.get(full, (None, None))
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            want = (f"between {lo} and {hi}" if lo is not None and hi is not None else
                    f">= {lo}" if lo is not None else f"<= {hi}")
            raise UserError(f"{full}={value} is out of range: it must be {want}"
                            f"{MEANING.get(full, '')}. Fix the config or its --set override.")


def _check_ranges(cfg: Config) -> None:
    check_fields(cfg)
    for name, n in cfg.data.feature_lengths.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"data.feature_lengths[{name!r}]={n!r} must be a positive integer")
    for axis in ("data", "fsdp", "tensor"):
        n = getattr(cfg.mesh, axis)
        if n == 0 or n < -1:
            raise UserError(f"mesh.{axis}={n}: use a positive size, or -1 for the remaining "
                            "devices")


def validate(cfg: Config) -> None:
    """Checks that need only the config (mesh/device checks live in partitioning.py)."""
    _check_ranges(cfg)  # every single field (CHOICES, RANGES); cross-field rules below
    m = cfg.model
    if cfg.data.batch_size % cfg.train.grad_accum_steps:
        raise UserError(f"data.batch_size={cfg.data.batch_size} must be divisible by "
                        f"train.grad_accum_steps={cfg.train.grad_accum_steps}")
    if not 0.0 <= m.dropout_rate < 1.0:
        raise UserError(f"model.dropout_rate must be in [0, 1), got {m.dropout_rate}")
    if not 0.0 <= m.mlm_predict_fraction <= 1.0 or (m.mlm_predict_fraction
                                                    and m.architecture != "encoder_only"):
        raise UserError(f"model.mlm_predict_fraction={m.mlm_predict_fraction}: use 0 (logits "
                        "at every position) or a fraction in (0, 1] of the length with "
                        "architecture='encoder_only' (BERT MLM)")
    if m.embed_dim < 0 or (m.embed_dim and m.architecture != "encoder_only"):
        raise UserError(f"model.embed_dim={m.embed_dim}: use 0 (= d_model), or a width > 0 "
                        "with architecture='encoder_only' (ELECTRA's embedding_size)")
    e = m.electra
    if (e.rtd_head or e.generator_d_model) and m.architecture != "encoder_only":
        raise UserError("model.electra.* (ELECTRA) needs architecture='encoder_only'.")
    if e.generator_d_model and not e.rtd_head:
        raise UserError("model.electra.generator_d_model > 0 needs model.electra.rtd_head=True "
                        "(the generator only feeds the discriminator).")
    if min(e.generator_d_model, e.generator_d_ff, e.generator_num_heads,
           e.generator_layers) < 0 or e.rtd_weight < 0:
        raise UserError("model.electra.generator_* and rtd_weight must be >= 0.")
    if cfg.train.aux_lm_weight < 0 or (cfg.train.aux_lm_weight and (
            m.num_classes <= 0 or m.architecture not in ("decoder_only", "prefix_lm"))):
        raise UserError(f"train.aux_lm_weight={cfg.train.aux_lm_weight}: use 0, or a weight "
                        ">= 0 (GPT-1: 0.5) with a decoder-only classifier (model.num_classes > 0)")


_DEFAULT = Config()


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


# Fields whose value for a config saved before they existed is not today's default (what
# that config trained with): from_dict and workdir.config_diff read a missing key as this.
LEGACY_VALUES = {"model.flat_kernels": False}


def from_dict(d: dict) -> Config:
    """Inverse of to_dict (used to reload the config saved next to a checkpoint)."""
    cfg = Config()
    seen = set()
    for section, values in d.items():
        if section == "name":
            cfg.name = values
            continue
        for k, v in flatten(values).items():
            set_by_path(cfg, f"{section}.{k}", tuple(v) if isinstance(v, list) else v)
            seen.add(f"{section}.{k}")
    for key, value in LEGACY_VALUES.items():
        if key not in seen:
            set_by_path(cfg, key, value)
    return cfg


def flatten(d: dict) -> dict:
    """A config dict (to_dict's) -> {"section.key": value}; feature_lengths stays one value."""
    from flax import traverse_util  # here: importing flax (and jax) would slow `t5lite models`
    return traverse_util.flatten_dict(
        d, sep=".", is_leaf=lambda path, _: bool(path) and path[-1] == "feature_lengths")
