"""seqio's offline cache without Apache Beam: run a task's deterministic preprocessing (up to
its seqio.CacheDatasetPlaceholder: parsing, tokenizing) once and write the result in the
format seqio reads with `use_cached=True` (what seqio's cache_tasks_main writes with Beam):

    CACHE_DIR/<task>/<split>.tfrecord-00000-of-0000N   tf.train.Examples (seqio.utils)
    CACHE_DIR/<task>/info.<split>.json                 features (shape, dtype), num_shards
    CACHE_DIR/<task>/stats.<split>.json                examples, tokens per feature
    CACHE_DIR/<task>/COMPLETED                         written last

Training reads it with `--set data.use_cached=true` (CACHE_DIR: data.cache_dir, default
<data dir>/seqio_cache); the random steps after the placeholder (span corruption, ...) still
run on the fly with the training seed.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import seqio
import tensorflow as tf

from t5lite import dataprep
from t5lite.errors import UserError
from t5lite.tasks.lookup import get_mixture_or_task


def default_cache_dir(cache_dir: str = "") -> str:
    return cache_dir or os.path.join(dataprep.data_dir(), "seqio_cache")


def use_cache_dir(cache_dir: str = "") -> str:
    """Make seqio look in cache_dir (default: <data dir>/seqio_cache) for cached tasks."""
    root = default_cache_dir(cache_dir)
    seqio.add_global_cache_dirs([root])
    return root


def check_cached(name: str, cache_dir: str = "") -> None:
    """UserError naming the command to run when a task (or a mixture's task) is not cached."""
    root = use_cache_dir(cache_dir)
    provider = get_mixture_or_task(name)
    for task in seqio.get_subtasks(provider):
        if not task.supports_caching:
            raise UserError(f"task {task.name!r} has no seqio.CacheDatasetPlaceholder in its "
                            "preprocessors, so it cannot be cached; set data.use_cached=false.")
        if not tf.io.gfile.exists(os.path.join(root, task.name, "COMPLETED")):
            raise UserError(f"task {task.name!r} is not cached in {root}: run `t5lite data "
                            f"cache {name}` first (or set data.use_cached=false).")


def _info(example: dict, num_shards: int) -> dict:
    feats = {}
    for k, v in example.items():
        t = tf.constant(v)
        shape = t.shape.as_list()
        feats[k] = {"shape": [None] + shape[1:] if shape else [], "dtype": t.dtype.name}
    return {"num_shards": num_shards, "features": feats, "seqio_version": seqio.__version__}


def _write_split(task, split: str, tmp: str, num_shards: int) -> dict:
    """Preprocess one split up to the placeholder into tmp's shards, info and stats files.
    -> the stats (examples, tokens per feature)."""
    from t5lite import progress
    ds = task.source.get_dataset(split=split, shuffle=False)
    ds = task.preprocess_precache(ds, seed=None)
    prefix = seqio.utils.get_cached_tfrecord_prefix(tmp, split)
    writers = [tf.io.TFRecordWriter(f"{prefix}-{i:05d}-of-{num_shards:05d}")
               for i in range(num_shards)]
    stats = {"examples": 0}
    info = None
    for i, ex in enumerate(progress.bar(ds.as_numpy_iterator(), desc=f"{task.name} {split}",
                                        unit="ex")):
        # seqio's beam_utils drops the provenance features too
        ex = {k: v for k, v in ex.items() if not k.startswith("provenance/")}
        info = info or _info(ex, num_shards)
        writers[i % num_shards].write(seqio.utils.dict_to_tfexample(ex).SerializeToString())
        stats["examples"] += 1
        for k in task.output_features:
            if k in ex:
                stats[f"{k}_tokens"] = stats.get(f"{k}_tokens", 0) + int((ex[k] != 0).sum())
    for w in writers:
        w.close()
    if info is None:
        raise UserError(f"task {task.name!r} split {split!r} is empty: nothing to cache.")
    for path, data in ((seqio.utils.get_cached_info_path(tmp, split), info),
                       (seqio.utils.get_cached_stats_path(tmp, split), stats)):
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(json.dumps(data, indent=1))
    return stats


def cache_task(name: str, splits: Sequence[str] = (), cache_dir: str = "", num_shards: int = 1,
               force: bool = False) -> list[str]:
    """Caches every task of `name` (a task or mixture) for `splits` (default: all of the
    task's splits). -> the task cache dirs. A cached task is left alone unless `force`."""
    root = default_cache_dir(cache_dir)
    out = []
    for task in seqio.get_subtasks(get_mixture_or_task(name)):
        if not task.supports_caching:
            raise UserError(f"task {task.name!r} has no seqio.CacheDatasetPlaceholder in its "
                            "preprocessors: nothing to cache (add one after the deterministic "
                            "steps, e.g. after seqio.preprocessors.tokenize).")
        task_dir = os.path.join(root, seqio.utils.get_task_dir_from_name(task.name))
        out.append(task_dir)
        if tf.io.gfile.exists(os.path.join(task_dir, "COMPLETED")) and not force:
            print(f"{task.name}: cached already in {task_dir}")
            continue
        tmp = task_dir + ".incomplete"  # renamed into place when every split is written
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.rmtree(tmp)
        tf.io.gfile.makedirs(tmp)
        for split in splits or task.splits:
            if split not in task.splits:
                raise UserError(f"task {task.name!r} has no split {split!r}; it has "
                                f"{', '.join(task.splits)}.")
            stats = _write_split(task, split, tmp, num_shards)
            print(f"{task.name} {split}: {stats['examples']} examples -> "
                  f"{seqio.utils.get_cached_tfrecord_prefix(task_dir, split)}-*")
        with tf.io.gfile.GFile(os.path.join(tmp, "COMPLETED"), "w") as f:
            f.write("")
        if tf.io.gfile.exists(task_dir):
            tf.io.gfile.rmtree(task_dir)
        tf.io.gfile.rename(tmp, task_dir)
    return out


def read_json(path: str) -> dict:
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)
