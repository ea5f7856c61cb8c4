"""`t5lite data cache --runner R`: seqio's own Beam caching pipeline (seqio/scripts/
cache_tasks_main.run_pipeline over seqio.beam_utils), on Beam's DirectRunner here or on
Dataflow / Flink / Spark for corpora one machine cannot tokenize (C4).

It writes the layout tasks/cache.py documents, with seqio's global example shuffle: the cached
order is not the source's, and it changes from one run of the pipeline to the next. Each task
is written under CACHE_DIR/.beam_incomplete/ and moved into place only once the whole pipeline
has finished, so a failed or cancelled job leaves an existing cache as it was.

apache-beam is the optional extra `pip install -e ".[beam]"` (setup.py says why it is not in the
default install: every apache-beam release caps protobuf below 7).
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Sequence

import seqio
import tensorflow as tf

from t5lite.errors import UserError
from t5lite.tasks import cache, tfds_dir
from t5lite.tasks.lookup import get_mixture_or_task

STAGING = ".beam_incomplete"
# the modules a Beam worker imports to find t5lite's tasks in seqio's registry
WORKER_MODULES = ("t5lite.tasks",)


def pipeline_args(runner: str, options: Sequence[str] = ()) -> list[str]:
    """The command-line options the pipeline is built from: --runner first, then the user's
    pass-through options (--project, --region, --temp_location, --flink_master, ...)."""
    return [f"--runner={runner}"] + [o for opt in options for o in shlex.split(opt)]


def describe_options(args: Sequence[str]) -> str:
    """The options Beam would submit, one a line: as Beam parses them (defaults left out) when
    apache-beam is installed, otherwise as given."""
    try:
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        return "pipeline options (as given; apache-beam is not installed):\n" + "\n".join(
            f"  {a}" for a in args)
    opts = PipelineOptions(list(args)).get_all_options(drop_default=True,
                                                       retain_unknown_options=True)
    return "pipeline options (as Beam parsed them):\n" + "\n".join(
        f"  --{k}={v}" for k, v in sorted(opts.items()))


def tasks_to_cache(names: Sequence[str], root: str, force: bool) -> list[seqio.Task]:
    """The cacheable tasks of `names` (tasks or mixtures) that are not cached in root yet (all
    of them with `force`); UserError for a task without a CacheDatasetPlaceholder."""
    out = []
    for name in names:
        for task in seqio.get_subtasks(get_mixture_or_task(name)):
            if not task.supports_caching:
                raise UserError(f"task {task.name!r} has no seqio.CacheDatasetPlaceholder in "
                                "its preprocessors: nothing to cache (add one after the "
                                "deterministic steps, e.g. after seqio.preprocessors.tokenize).")
            done = tf.io.gfile.exists(os.path.join(root, task.name, "COMPLETED"))
            if done and not force:
                print(f"{task.name}: cached already in {os.path.join(root, task.name)}")
            elif task not in out:
                out.append(task)
    return out


def _set_seqio_flags(num_shards: int, tfds_data_dir: str) -> None:
    """run_pipeline reads its shard counts and TFDS dir from cache_tasks_main's absl flags."""
    from seqio.scripts import cache_tasks_main
    # 0 shards: one output file per source shard (seqio's default of at least 64 files is
    # meant for C4-sized tasks; --shards 64 asks for it)
    flags = [f"--min_shards={num_shards}", f"--max_shards={num_shards}"]
    if tfds_data_dir:
        flags.append(f"--tfds_data_dir={tfds_data_dir}")
    cache_tasks_main.FLAGS(["t5lite data cache"] + flags, known_only=True)


def run(names: Sequence[str], runner: str = "DirectRunner", options: Sequence[str] = (),
        cache_dir: str = "", num_shards: int = 0, force: bool = False,
        tfds_data_dir: str = "", dry_run: bool = False) -> list[str]:
    """Caches the tasks of `names` with seqio's Beam pipeline. -> the task cache dirs written
    (none on a dry run, which prints the pipeline options instead)."""
    root = cache.default_cache_dir(cache_dir)
    args = pipeline_args(runner, options)
    tasks = tasks_to_cache(names, root, force)
    if dry_run:
        what = (f"would cache {', '.join(t.name for t in tasks) or 'nothing'} into {root} "
                "with ")
        print(what + ("t5lite's one-process writer (no Beam)" if runner == "local" else
                      f"seqio's Beam pipeline; {describe_options(args)}"))
        return []
    if not tasks:
        return []
    try:
        import apache_beam as beam
        from seqio.scripts import cache_tasks_main
    except ImportError as e:
        raise UserError(f"`t5lite data cache --runner {runner}` needs Apache Beam ({e}): "
                        "pip install -e \".[beam]\", or use --runner local.") from None
    staging = os.path.join(root, STAGING)
    if tf.io.gfile.exists(staging):  # a failed earlier job's partial output
        tf.io.gfile.rmtree(staging)
    # the workers read TFDS from there too (seqio's PreprocessTask sets it on each)
    _set_seqio_flags(num_shards, tfds_dir.use_tfds_data_dir(tfds_data_dir))
    pattern = [re.escape(t.name) for t in tasks]
    with beam.Pipeline(options=beam.options.pipeline_options.PipelineOptions(args)) as p:
        cache_tasks_main.run_pipeline(p, pattern, staging, modules_to_import=WORKER_MODULES,
                                      ignore_other_caches=True)
    out = [_move_into_place(staging, root, t) for t in tasks]
    tf.io.gfile.rmtree(staging)
    cache.use_cache_dir(root)  # this process's seqio finds them (as seqio's own job does)
    return out


def _move_into_place(staging: str, root: str, task: seqio.Task) -> str:
    name = seqio.utils.get_task_dir_from_name(task.name)
    src, dst = os.path.join(staging, name), os.path.join(root, name)
    if not tf.io.gfile.exists(os.path.join(src, "COMPLETED")):
        raise UserError(f"the Beam job left no COMPLETED file for {task.name!r} in {src}; "
                        "its cache was not replaced. See the runner's log.")
    if tf.io.gfile.exists(dst):
        tf.io.gfile.rmtree(dst)
    tf.io.gfile.rename(src, dst)
    for split in task.splits:
        stats = seqio.utils.get_cached_stats_path(dst, split)
        if tf.io.gfile.exists(stats):
            print(f"{task.name} {split}: {cache.read_json(stats)['examples']} examples -> "
                  f"{seqio.utils.get_cached_tfrecord_prefix(dst, split)}-*")
    return dst
