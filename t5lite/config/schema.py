"""The config's typed sections: every field with its default, its allowed values (choices or
range, beside the field) and what it means.

Every section refuses an assignment to a name that is not one of its fields (a typo in a config
file, ``cfg.train.stpes = 20``, would otherwise be ignored silently), and any assignment once
the config is frozen (load_config freezes what it validated; derive a changed one with
config.replace).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from t5lite.config.model_schema import ElectraConfig, ModelConfig, PeftConfig
from t5lite.config.sections import (
    FROZEN_MESSAGE, SECTION_PATHS, Section, UnknownKeyError, field_names, freeze, is_frozen,
    setting, unknown_key)

__all__ = [
    "CheckpointConfig", "Config", "DataConfig", "DecodeConfig", "ElectraConfig", "EvalConfig",
    "FROZEN_MESSAGE", "MeshConfig", "ModelConfig", "OptimizerConfig", "PeftConfig",
    "SECTION_PATHS", "Section", "TrainConfig", "UnknownKeyError", "field_names", "freeze",
    "is_frozen", "setting", "unknown_key"]


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
    # written by `t5lite train`, not by hand: per task_modules entry "sha256:HEX /abs/path",
    # the file it was imported from, so eval / infer import that file from any directory and
    # warn when it changed (tasks/user_modules.py); unused when the counts differ
    task_module_files: tuple = ()
    # refuse a run when more than this share of a task's sampled targets is longer than
    # feature_lengths["targets"] (or decode.max_length): seqio would cut them, and a cut
    # target is never predicted whole (tasks/lengths.py); 1.0 = train on cut targets
    max_trimmed: float = setting(0.01, bounds=(0.0, 1.0))
    # training data is read as this many seqio shards (tasks/pipeline.py ShardedBatches), so a
    # run can resume on any process count that divides it or that it divides; 0 = the process
    # count of the run that started the workdir. Set it to the largest slice you may grow to.
    num_shards: int = setting(0, bounds=(0, None))
    # read the tasks' preprocessed data from `t5lite data cache` (seqio's cache format) in
    # cache_dir ("" = <data dir>/seqio_cache) instead of tokenizing on the fly
    use_cached: bool = False
    cache_dir: str = ""
    # where TFDS-backed tasks (C4, the paper's benchmarks) read their prepared datasets: a
    # gs:// bucket for a pod (every host reads it in place); "" = $TFDS_DATA_DIR or
    # ~/tensorflow_datasets (tasks/tfds_dir.py)
    tfds_data_dir: str = ""
    # the vocabulary of the `--scale paper` tasks (C4 and the paper benchmarks from TFDS:
    # tasks/builtin.py register_paper): t5 (T5's cc_all 32k), cc_en (Narang et al.'s
    # English-only 32k, read from gs://t5-data at first use: tasks/vocabularies.py), or
    # t5lite_sp8k (the local 8k one: a paper-scale run rehearsed on TFDS fixtures, the tests)
    paper_vocabulary: str = setting("t5", choices=("t5", "cc_en", "t5lite_sp8k"))


@dataclasses.dataclass
class OptimizerConfig(Section):
    name: str = setting("adafactor", choices=("adafactor", "adamw", "adamw_rms_scaled"))
    learning_rate: float = setting(1e-2, bounds=(0.0, None))  # peak
    schedule: str = setting("rsqrt", choices=("rsqrt", "constant", "cosine", "linear"))
    warmup_steps: int = setting(1000, bounds=(0, None))
    # rsqrt only: the rate also ramps linearly from 0 over these steps (Mesh TF's linear_warmup
    # multiplier; Narang et al.'s Adam rows: 4,000 of the rsqrt's 10,000); 0 = T5's constant
    # warm-up
    ramp_steps: int = setting(0, bounds=(0, None))
    weight_decay: float = setting(0.0, bounds=(0.0, None))
    b1: float = setting(0.9, bounds=(0.0, 1.0))
    b2: float = setting(0.999, bounds=(0.0, 1.0))
    eps: float = setting(1e-8, bounds=(0.0, None))
    # adamw / adamw_rms_scaled: divide Adam's moments by 1 - b1^t and 1 - b2^t (Kingma & Ba;
    # optax's adamw).
    # False: Mesh TF's AdamWeightDecayOptimizer (mesh_tensorflow/optimize.py :171-174,
    # update = m / (sqrt(v) + eps) from the raw moments), what Narang et al.'s ReZero / Fixup
    # rows trained with. Its steps are optax's times (1 - b1^t) / sqrt(1 - b2^t): 3.2x at the
    # first, 6.6x at the 12th, 1.26x at the 1,000th, 1.01x at the 4,000th
    bias_correction: bool = True
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
    # The TPU slice this config's mesh, remat and batch were chosen for (a gcloud type or JAX
    # topology name, tpu/topology.py); `t5lite compile` compiles for it when given no
    # --topology. Describes, never enforces: the same config runs on any devices.
    topology: str = ""
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
    # new tokens per example (EOS included); 0 = data.feature_lengths["targets"], so a run
    # whose targets are made longer decodes them whole (config.decode_length)
    max_length: int = setting(0, bounds=(0, None))
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


SECTION_PATHS.update(_section_paths(Config))
