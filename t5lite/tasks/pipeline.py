"""get_dataset: a seqio task or mixture -> batched model features for one process."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Mapping, Optional

import seqio
import tensorflow as tf

from t5lite.errors import UserError
from t5lite.tasks import converters


def _import_file(path: str) -> None:
    key = "t5lite_user_tasks_" + os.path.splitext(os.path.basename(path))[0]
    if key in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise


def import_task_modules(modules) -> None:
    """Import the user's task-registering modules (data.task_modules) once each."""
    for name in modules:
        try:
            if name.endswith(".py"):
                _import_file(os.path.abspath(name))
            else:
                if os.getcwd() not in sys.path:
                    sys.path.insert(0, os.getcwd())
                importlib.import_module(name)
        except (ImportError, FileNotFoundError) as e:
            raise UserError(f"data.task_modules: cannot import {name!r} ({e}). Give a module "
                            "importable from the current directory or a path to a .py "
                            "file.") from None


def get_mixture_or_task(name: str):
    """seqio's lookup, with a UserError that lists close names."""
    import t5lite.tasks  # noqa: F401  (registers everything)
    try:
        return seqio.get_mixture_or_task(name)
    except ValueError:
        import difflib
        known = sorted(seqio.TaskRegistry.names()) + sorted(seqio.MixtureRegistry.names())
        hint = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        raise UserError(f"no task or mixture named {name!r}." + (
            f" Did you mean: {', '.join(hint)}?" if hint else "")
            + " See `t5lite tasks list`.") from None


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
    if data_dir:
        os.environ["T5LITE_DATA_DIR"] = data_dir
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
        from t5lite.tasks import cache
        cache.check_cached(mixture_or_task, cache_dir)
    ds = provider.get_dataset(source_lengths, split=split, shuffle=shuffle, seed=seed,
                              shard_info=shard_info, num_epochs=num_epochs,
                              use_cached=use_cached)
    ds = converter(ds, lengths)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)
