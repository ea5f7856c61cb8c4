"""get_dataset: a seqio task or mixture -> batched model features for one process."""

from __future__ import annotations

import os
from typing import Mapping, Optional

import seqio
import tensorflow as tf

from t5lite import dataprep
from t5lite.errors import UserError
from t5lite.tasks import cache, converters
from t5lite.tasks.lookup import get_mixture_or_task  # noqa: F401  (pipeline.get_mixture_or_task)


def import_task_modules(modules, saved=()) -> tuple:
    """Import the user's task-registering modules (data.task_modules) once each; ``saved``:
    the run's data.task_module_files, to import the files it was trained with. -> their
    records (user_modules.import_modules)."""
    from t5lite.tasks import user_modules
    return user_modules.import_modules(modules, saved)


def task_features(provider) -> list[str]:
    """The features a task (or every task of a mixture) produces, from its element spec."""
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    names = None
    for task in tasks:
        feats = set(task.output_features)
        names = feats if names is None else names & feats
    return sorted(names)


def get_dataset(mixture_or_task: str, feature_lengths: Mapping[str, int], architecture: str,
                batch_size: int, split: str = "train", shuffle: bool = True, seed: int = 0,
                pack: bool = True, shard_info: Optional[seqio.ShardInfo] = None,
                num_epochs: Optional[int] = None, drop_remainder: bool = True,
                data_dir: str = "", use_cached: bool = False,
                cache_dir: str = "") -> tf.data.Dataset:
    """Batched, feature-converted examples for this process (CONTRACTS.md batch keys).

    ``batch_size`` is per process; ``shard_info`` (seqio.ShardInfo(process_index,
    process_count)) gives each process a disjoint part. ``num_epochs=None`` repeats forever
    (training); evaluation passes 1. The same seed gives the same batches (shuffling and every
    random preprocessor are seeded). ``data_dir`` overrides $T5LITE_DATA_DIR for this process.
    ``use_cached``: read the output of `t5lite data cache` (seqio's cache format) from
    ``cache_dir`` (default <data dir>/seqio_cache) instead of preprocessing on the fly.
    """
    dataprep.use_data_dir(data_dir)
    provider = get_mixture_or_task(mixture_or_task)
    feats = task_features(provider)
    converter = converters.make_converter(architecture, feats, pack=pack,
                                          task_name=mixture_or_task)
    if isinstance(converter, converters.EncoderFeatureConverter):
        if "inputs" not in feature_lengths:
            raise UserError("encoder_only needs data.feature_lengths={'inputs': L}.")
        lengths = converter.task_lengths(feature_lengths["inputs"])
    else:
        missing = [k for k in converter.TASK_FEATURES if k not in feature_lengths]
        if missing:
            raise UserError(f"data.feature_lengths={dict(feature_lengths)} lacks "
                            f"{', '.join(missing)}, needed by {mixture_or_task!r} on "
                            f"{architecture}; e.g. {{'inputs': 512, 'targets': 114}}.")
        lengths = {k: feature_lengths[k] for k in converter.TASK_FEATURES}
    if split not in provider.splits:
        raise UserError(f"{mixture_or_task!r} has no split {split!r}; it has "
                        f"{', '.join(provider.splits)}.")
    # Per-example labels have no length; seqio would try to trim them.
    source_lengths = {k: v for k, v in lengths.items() if k not in converters.EXAMPLE_EXTRAS}
    if use_cached:
        cache.check_cached(mixture_or_task, cache_dir)
    ds = provider.get_dataset(source_lengths, split=split, shuffle=shuffle, seed=seed,
                              shard_info=shard_info, num_epochs=num_epochs,
                              use_cached=use_cached)
    ds = converter(ds, lengths)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------- training input
#
# Resuming on another number of processes (a larger or smaller slice) must continue at the
# same global position. The choice, weighed:
# - grain over ArrayRecord: index-addressable, so any process count can seek to a global
#   index; but every seqio task (span corruption, packing, mixtures) would need rewriting as a
#   grain pipeline over converted ArrayRecord files: a second data stack.
# - seqio's deterministic pipelines (cached, pre-shuffled TFRecords via seqio's cache job):
#   index-addressable too, but they need an offline Beam cache job per task and give up
#   on-the-fly packing and random objectives per epoch.
# - every process iterating the one global tf.data stream and keeping its own rows: the state
#   is process-count independent, but on a pod each host tokenises, corrupts and packs the
#   whole global batch (64 hosts = 64x the input work, and the host CPU is what feeds the chips).
# - chosen: the global batch is read from a fixed number S of seqio shards (data.num_shards,
#   default: the first run's process count), each its own tf.data stream of B/S rows with its
#   own checkpointed iterator state (data_state/<step>/shard_<j>_of_<S>.*). The global batch
#   is always shard 0's rows, then shard 1's, ...; a run on P processes gives process p the
#   shards p*S/P ... (S divisible by P), or, with more processes than shards, a slice of the
#   rows of shard p // (P/S) (P divisible by S). So the state does not depend on P, nothing is
#   repeated or skipped, the input work is not multiplied while P <= S (only P/S-fold when the
#   slice outgrows S), and seqio, packing and the exact O(1) tf.data resume stay as they are.
#   Set data.num_shards to the largest process count a run may grow to (a power of two keeps
#   every smaller power of two possible); each shard costs its process one shuffle buffer.


def shard_layout(num_shards: int, process_index: int, process_count: int, batch_size: int):
    """-> (shard indices this process reads, (row start, row stop) of each shard batch it
    keeps). UserError when the shard count and process count do not nest."""
    S, P = num_shards, process_count
    if S % P and P % S:
        raise UserError(
            f"the training data of this workdir is read as {S} shards, which {P} processes "
            f"cannot split evenly; run on a process count that divides {S} or that {S} "
            "divides, or start a new workdir")
    if batch_size % max(S, P):
        raise UserError(f"data.batch_size={batch_size} must be divisible by the {S} data "
                        f"shards and the {P} processes")
    rows = batch_size // S
    if S % P == 0:
        k = S // P
        return list(range(process_index * k, (process_index + 1) * k)), (0, rows)
    m = P // S
    part = rows // m
    start = (process_index % m) * part
    return [process_index // m], (start, start + part)


class ShardedBatches:
    """This process's rows of each global batch, from a fixed number of seqio shards (see
    the comment above); checkpointable with save_state / restore_state."""

    def __init__(self, make_dataset, num_shards: int, batch_size: int, process_index: int,
                 process_count: int):
        """make_dataset(shard_info, per_shard_batch_size) -> tf.data.Dataset."""
        self.num_shards = num_shards
        self.shards, (self.row_start, self.row_stop) = shard_layout(
            num_shards, process_index, process_count, batch_size)
        self.first_owner = self.row_start == 0  # writes the shard's state (one writer each)
        per_shard = self.rows = batch_size // num_shards
        self.iterators = [iter(make_dataset(seqio.ShardInfo(j, num_shards), per_shard))
                          for j in self.shards]

    def __iter__(self):
        return self

    def __next__(self):
        parts = [next(it) for it in self.iterators]
        if len(parts) == 1 and self.row_start == 0 and self.row_stop >= self.rows:
            return parts[0]
        keys = parts[0].keys()
        return {k: tf.concat([p[k][self.row_start:self.row_stop] for p in parts], 0)
                for k in keys}

    def _prefix(self, directory: str, j: int) -> str:
        return os.path.join(directory, f"shard_{j}_of_{self.num_shards}")

    def save_state(self, directory: str) -> None:
        if self.first_owner:
            for j, it in zip(self.shards, self.iterators):
                tf.train.Checkpoint(iterator=it).write(self._prefix(directory, j))

    def restore_state(self, directory: str) -> None:
        """Raises (FileNotFoundError, tf errors) when the state is missing or damaged."""
        for j, it in zip(self.shards, self.iterators):
            prefix = self._prefix(directory, j)
            legacy = os.path.join(directory, f"process_{j}")  # older layout: one per process
            if not tf.io.gfile.exists(prefix + ".index") and tf.io.gfile.exists(
                    legacy + ".index"):
                prefix = legacy
            if not tf.io.gfile.exists(prefix + ".index"):
                raise FileNotFoundError(f"no data iterator state {prefix}.index")
            tf.train.Checkpoint(iterator=it).read(prefix).assert_consumed()


def saved_num_shards(data_state_dir: str):
    """The shard count of the newest data_state/<step>/ that has shard files (or, in the older
    layout, process_<i> files: one shard per process), else None."""
    import re
    if not tf.io.gfile.isdir(data_state_dir):
        return None
    steps = sorted((int(d.rstrip("/")) for d in tf.io.gfile.listdir(data_state_dir)
                    if d.rstrip("/").isdigit()), reverse=True)
    for step in steps:
        names = tf.io.gfile.listdir(os.path.join(data_state_dir, str(step)))
        for name in names:
            m = re.fullmatch(r"shard_\d+_of_(\d+)\.index", name)
            if m:
                return int(m.group(1))
        # the older layout, process_<i>: shard i of as many shards as processes
        legacy = [n for n in names if re.fullmatch(r"process_\d+\.index", n)]
        if legacy:
            return len(legacy)
    return None
