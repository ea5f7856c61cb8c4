"""What can be checked of a user's task before a run reads it for real: its split's files
exist, every line parses (parse_tsv / parse_jsonl), one example builds with the features the
task declares, and eval.best_metric names a metric the evaluation gives. Each mistake is one
UserError naming the file (and line) and the fix, seconds into a command rather than after
compiling. Only tasks registered by data.task_modules are checked: the built-in ones read
prepared files (dataprep.require) and are covered by the tests.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from typing import Mapping, Sequence

import seqio
import tensorflow as tf

from t5lite.errors import UserError
from t5lite.tasks import registry, user_modules
from t5lite.tasks.lookup import get_mixture_or_task


def check_task(name: str, split: str, feature_lengths: Mapping[str, int]) -> None:
    """The user's tasks in ``name`` (a task or mixture): ``split`` exists, its files exist
    and parse, and one example builds with every feature the task declares."""
    provider = get_mixture_or_task(name)
    mine = [t for t in seqio.get_subtasks(provider) if t.name in user_modules.REGISTERED_BY]
    if not mine:  # built-in: prepared files, or TFDS, whose splits live in a bucket's info
        return
    if split not in provider.splits:
        raise UserError(f"{name!r} has no split {split!r}; it has "
                        f"{', '.join(provider.splits)}.")
    for task in mine:
        origin = user_modules.REGISTERED_BY[task.name]
        where = f"task {task.name!r} ({origin}), split {split!r}"
        files = _check_files(task, split, where)
        parser = _line_parser(task)
        if parser is not None:
            for path in files:
                _scan(path, parser, getattr(task.source, "_skip_header_lines", 0), where)
        _check_one_example(task, split, feature_lengths, where, parser)


def missing_files(task, splits: Sequence[str]) -> list[str]:
    """The file patterns of a file source's ``splits`` that match no file."""
    source = task.source
    if not isinstance(source, seqio.FileDataSource):
        return []
    out = []
    for split in splits:
        patterns = source._split_to_filepattern[split]  # pylint: disable=protected-access
        out += [p for p in ([patterns] if isinstance(patterns, str) else list(patterns))
                if not tf.io.gfile.glob(p)]
    return out


def _check_files(task, split: str, where: str) -> list[str]:
    """Every file pattern of a file source matches a file; -> the files."""
    if not isinstance(task.source, seqio.FileDataSource):
        return []
    for pattern in missing_files(task, [split])[:1]:
        relative = "" if os.path.isabs(pattern) or "://" in pattern else (
            f" (relative to the current directory {os.getcwd()}; a path built from "
            "os.path.dirname(__file__) works from any directory)")
        raise UserError(f"{where} reads {pattern}, which matches no file{relative}: fix "
                        "the path in the module or create the file.")
    return list(task.source.list_shards(split))


def _line_parser(task):
    """(kind, field names, JSON keys) of the task's parse_tsv / parse_jsonl step, or None."""
    for step in task.preprocessors:
        fn = step.func if isinstance(step, functools.partial) else step
        kw = step.keywords if isinstance(step, functools.partial) else {}
        fields = tuple(kw.get("field_names", ("inputs", "targets")))
        if fn is registry.parse_tsv:
            return "tsv", fields, ()
        if fn is registry.parse_jsonl:
            return "jsonl", fields, tuple(kw.get("json_keys") or fields)
    return None


def _lines(path: str):
    """(number, text) of each line as TextLineDataSource reads it ("\\n" / "\\r\\n" ends)."""
    opener = tf.io.gfile.GFile if "://" in path else open
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            yield number, (line[:-1] if line.endswith(b"\r") else line)


def _scan(path: str, parser, skip: int, where: str) -> None:
    """The first line parse_tsv / parse_jsonl cannot read, as a UserError naming it."""
    kind, fields, keys = parser
    for number, line in _lines(path):
        if number <= skip:
            continue
        if kind == "tsv":
            found = line.count(b"\t") + 1
            if found != len(fields):
                what = "is empty" if not line else (
                    f"has {found} tab-separated field{'s' * (found != 1)}")
                raise UserError(f"{path} line {number} {what}; parse_tsv expects "
                                f"{len(fields)}: {'<TAB>'.join(fields)} ({where}): fix or "
                                "remove the line.")
        else:
            why = registry.jsonl_problem(line, keys)
            if why:
                raise UserError(f"{path} line {number} {why} ({where}): fix or remove the "
                                "line.")


RENAME_HINT = ("name the columns so (parse_tsv and parse_jsonl call theirs inputs and "
               "targets; field_names=... or seqio.preprocessors.rekey renames them).")


def _check_one_example(task, split: str, feature_lengths, where: str, parser) -> None:
    """Build the task's preprocessing (seqio's own steps, as get_dataset runs them) and read
    one example: the features it declares are produced, and the split is not empty."""
    lengths = {k: v for k, v in feature_lengths.items() if k in task.output_features}
    ds = task.source.get_dataset(split=split, shuffle=False)
    try:
        ds = task.preprocess_precache(ds, seed=0)
        ds = task.preprocess_postcache(ds, sequence_length=lengths or None, seed=0)
    except KeyError as e:  # a step reads a feature an earlier one did not make (autograph's
        # error is a KeyError whose message ends "KeyError: 'name'")
        key = re.findall(r"KeyError: '([^']*)'", str(e)) or [e.args[0] if e.args else "?"]
        made = f" (parse_{parser[0]} makes {', '.join(parser[1])})" if parser else ""
        raise UserError(f"{where}: a preprocessor reads the feature {key[-1]!r}, which the "
                        f"examples do not have at that step{made}: {RENAME_HINT}") from None
    spec = ds.element_spec
    # (seqio's tokenize keeps each text as NAME_pretokenized: not a column of the user's)
    produced = sorted(k for k in spec if not k.endswith("_pretokenized")) if isinstance(
        spec, Mapping) else []
    missing = [k for k, f in task.output_features.items() if f.required and k not in produced]
    if missing:
        have = ", ".join(produced) or "no features"
        raise UserError(
            f"{where}: after its preprocessors the examples have {have}, not "
            f"{', '.join(missing)}, which its output_features need: {RENAME_HINT}")
    if next(iter(ds.take(1)), None) is None:
        raise UserError(f"{where} has no examples: give the split some lines.")


# ----------------------------------------------------------------------------- metrics


def _metric_keys(fn):
    """The names a metric function's result holds (t5lite.tasks.metrics marks them), or
    None for a function of the user's own."""
    return getattr(getattr(fn, "func", fn), "metric_keys", None)


def metric_names(tasks: Sequence[str], classifier: bool = False):
    """-> (the "task/metric" names evaluating ``tasks`` gives, the tasks with a metric
    function of the user's own, whose names only its result shows). ``classifier``: the
    model's classifier head is scored (accuracy, majority_class per task)."""
    names, unknown = set(), set()
    for t in tasks:
        if classifier:
            names |= {f"{t}/accuracy", f"{t}/majority_class"}
            continue
        for task in seqio.get_subtasks(get_mixture_or_task(t)):
            for fn in task.metric_fns:
                keys = _metric_keys(fn)
                if keys is None:
                    unknown.add(task.name)
                else:
                    names |= {f"{task.name}/{k}" for k in keys}
    return names, unknown


def check_best_metric(metric: str, tasks: Sequence[str], classifier: bool = False) -> None:
    """eval.best_metric is a name evaluating ``tasks`` gives (before anything is trained)."""
    if not metric:
        return
    names, unknown = metric_names(tasks, classifier)
    if metric in names or metric.split("/", 1)[0] in unknown:
        return
    close = difflib.get_close_matches(metric, sorted(names), n=1)
    raise UserError(
        f"eval.best_metric={metric!r} is not a metric this run evaluates"
        + (f" (eval tasks {', '.join(tasks)} give {', '.join(sorted(names))})" if names
           else f" ({', '.join(tasks)} have no metric_fns)")
        + (f": did you mean {close[0]!r}?" if close else ": set one of those, as TASK/NAME."))


# ----------------------------------------------------------------------------- prefix


def text_prefix(name: str):
    """The text-to-text prefix a task puts before its inputs (its registry.add_prefix step),
    or None (no such step, or a mixture)."""
    provider = get_mixture_or_task(name)
    if not isinstance(provider, seqio.Task):
        return None
    for step in provider.preprocessors:
        if isinstance(step, functools.partial) and step.func is registry.add_prefix and \
                step.keywords.get("key", "inputs") == "inputs" and "prefix" in step.keywords:
            return step.keywords["prefix"]
    return None
