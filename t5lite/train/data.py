"""Training data: the task's preparation and checks, this process's batch iterators, and host
batches -> global jax.Arrays sharded over the mesh's batch axes."""

from __future__ import annotations

import os

import jax
import numpy as np

from t5lite.errors import UserError
from t5lite.mesh import partitioning


def prepare_tasks(cfg):
    """Point seqio at the data dir (preparing it if train.prepare_data asks), import the task
    modules, check the vocabulary fits the model, and check what the run will read of the
    user's tasks (their files, lines, one example) and eval.best_metric, before anything is
    compiled or written. -> cfg with data.task_module_files (the modules' files and hashes,
    saved with the run so eval / infer import them from any directory)."""
    from t5lite import config as config_lib, dataprep
    dataprep.use_data_dir(cfg.data.data_dir)
    if cfg.train.prepare_data:
        # every process (hosts may have local disks); a file lock serialises shared ones
        dataprep.ensure_prepared(cfg.train.prepare_data, cfg.data.data_dir)
    from t5lite.tasks import builtin, pipeline, tfds_dir
    tfds_dir.use_tfds_data_dir(cfg.data.tfds_data_dir)
    builtin.use_paper_vocabulary(cfg.data.paper_vocabulary)
    files = pipeline.import_task_modules(cfg.data.task_modules)
    task = pipeline.get_mixture_or_task(cfg.data.mixture_or_task)
    for name, feat in task.output_features.items():
        size = feat.vocabulary.vocab_size
        if size > cfg.model.vocab_size:
            raise UserError(
                f"model.vocab_size={cfg.model.vocab_size} is smaller than the {size} ids of "
                f"task {cfg.data.mixture_or_task!r} (feature {name!r}). Set model.vocab_size "
                f">= {size} (a multiple of 128 is fastest).")
    check_run_data(cfg)
    if files == tuple(cfg.data.task_module_files):
        return cfg
    return config_lib.replace(cfg, {"data.task_module_files": files})


def check_run_data(cfg) -> None:
    """tasks/preflight.py on every (task, split) the run reads: training, train.eval_steps'
    batches and the seqio evaluation (whose eval.best_metric must be one of its metrics)."""
    from t5lite.eval.evaluation import TrainEvaluator
    from t5lite.tasks import preflight
    d, lengths = cfg.data, dict(cfg.data.feature_lengths)
    reads = [(d.mixture_or_task, d.train_split)]
    if cfg.train.eval_steps > 0:
        reads.append((d.mixture_or_task, d.eval_split))
    eval_tasks = tuple(cfg.eval.tasks) or (d.mixture_or_task,)
    if TrainEvaluator.wanted(cfg):
        reads += [(t, cfg.eval.split) for t in eval_tasks]
    for name, split in dict.fromkeys(reads):
        preflight.check_task(name, split, lengths)
    preflight.check_best_metric(cfg.eval.best_metric, eval_tasks, cfg.model.num_classes > 0)
    from t5lite import config as config_lib
    from t5lite.tasks import lengths as lengths_lib
    decodes = (TrainEvaluator.wanted(cfg) and cfg.model.num_classes <= 0
               and cfg.model.architecture != "encoder_only")
    lines = lengths_lib.check(reads, lengths, d.max_trimmed,
                              config_lib.decode_length(cfg) if decodes else 0)
    if jax.process_index() == 0:
        for line in lines:
            print(f"t5lite: {line}", flush=True)


def train_iterator(cfg, workdir: str):
    """This process's rows of each global training batch, read as data.num_shards seqio
    shards (the workdir's saved shard count wins), so its checkpointed state resumes on
    another process count (tasks/pipeline.py ShardedBatches)."""
    from t5lite.tasks import pipeline
    num_shards = (_saved_num_shards(os.path.join(workdir, "data_state"))
                  or cfg.data.num_shards or jax.process_count())

    def make_dataset(shard_info, batch_size):
        return pipeline.get_dataset(
            cfg.data.mixture_or_task, feature_lengths=dict(cfg.data.feature_lengths),
            architecture=cfg.model.architecture, batch_size=batch_size,
            split=cfg.data.train_split, shuffle=cfg.data.shuffle, seed=cfg.data.seed,
            pack=cfg.data.pack, shard_info=shard_info, use_cached=cfg.data.use_cached,
            cache_dir=cfg.data.cache_dir)

    return pipeline.ShardedBatches(make_dataset, num_shards, cfg.data.batch_size,
                                   jax.process_index(), jax.process_count())


def _saved_num_shards(data_state_dir: str):
    """pipeline.saved_num_shards, which reads only file names (through TensorFlow's
    filesystem): on gs:// it reads a local tree of empty files with the bucket's names."""
    from t5lite.store import gcs
    from t5lite.tasks import pipeline
    if not gcs.is_gcs(data_state_dir):
        return pipeline.saved_num_shards(data_state_dir)
    with gcs.staged_download(data_state_dir, names_only=True) as names:
        return pipeline.saved_num_shards(names)


def dataset_iterator(cfg, split: str, shuffle: bool, num_epochs=None):
    """A tf.data iterator over this process's batches of `split` (evaluation: no state)."""
    from t5lite.tasks import pipeline
    ds = pipeline.get_dataset(
        cfg.data.mixture_or_task, feature_lengths=dict(cfg.data.feature_lengths),
        architecture=cfg.model.architecture,
        batch_size=cfg.data.batch_size // jax.process_count(), split=split, shuffle=shuffle,
        seed=cfg.data.seed, pack=cfg.data.pack, shard_info=partitioning.shard_info(),
        num_epochs=num_epochs, use_cached=cfg.data.use_cached, cache_dir=cfg.data.cache_dir)
    return iter(ds)


def to_numpy(batch) -> dict:
    return {k: np.asarray(v) for k, v in batch.items()}


def next_train_batch(data_iter, batch_sharding, step: int, total: int):
    """-> (this process's host batch, the global batch on the mesh) for `step` of `total`."""
    try:
        host = to_numpy(next(data_iter))
    except StopIteration:
        raise UserError(f"training data ran out at step {step} of {total}; use "
                        "num_epochs=None (repeat) or fewer train.steps") from None
    return host, partitioning.global_batch(host, batch_sharding)


def parse_skip(spec: str):
    """train.skip_batches "S:N" -> (S, N); "" -> None. A malformed one is a UserError."""
    if not spec:
        return None
    try:
        at, count = (int(x) for x in spec.split(":"))
        if at < 0 or count < 1:
            raise ValueError
    except ValueError:
        raise UserError(f"train.skip_batches={spec!r}: give \"S:N\" (resume at step S, "
                        "then skip the next N batches), e.g. \"1200:200\"") from None
    return at, count


def skip_batches(cfg, data_iter, start: int, info=print) -> int:
    """Restart-and-skip: when this run resumes at train.skip_batches' step S, read and drop the
    next N batches (all hosts alike: each drops its rows of the same global batches), so the
    steps from S on see the data after them. -> the number skipped (0 at any other step)."""
    skip = parse_skip(cfg.train.skip_batches)
    if skip is not None and start < skip[0] < cfg.train.steps:
        info(f"note: train.skip_batches={cfg.train.skip_batches!r} is not applied: this run "
             f"starts at step {start} and will train through step {skip[0]} (the skip happens "
             f"only when a run resumes at step {skip[0]}: rerun from there)")
    if skip is None or skip[0] != start:
        return 0
    for n in range(skip[1]):
        try:
            next(data_iter)
        except StopIteration:
            raise UserError(f"training data ran out after skipping {n} of {skip[1]} "
                            f"batches (train.skip_batches={cfg.train.skip_batches!r}); skip "
                            "fewer") from None
    info(f"skipped {skip[1]} training batches at step {start} (train.skip_batches)")
    return skip[1]
