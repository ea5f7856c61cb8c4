"""Do the task's examples fit data.feature_lengths? Measured on a sample before a run trains
or evaluates, so a length that cuts the targets is refused with the numbers and the --set
that fixes it, instead of training on cut targets that no prediction can then match.

seqio trims every feature to its length without a word (append_eos_after_trim). The untrimmed
lengths are what the same task gives with ``sequence_length=None``: its own preprocessors,
tokenizer and EOS, nothing trimmed. Preprocessors that need the lengths to make their examples
(the pretraining objectives: span corruption cuts a corpus into rows of exactly those lengths)
cannot be measured this way and need no measuring: their rows are made to fit.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Mapping, Optional, Sequence

import numpy as np
import seqio

from t5lite.errors import UserError
from t5lite.tasks.lookup import get_mixture_or_task

SAMPLE = 1000  # examples read per (task, split): seconds, and a share known to ~3 points


@functools.lru_cache(maxsize=128)
def _measured(task_name: str, split: str, data_dir: str) -> Optional[dict]:
    """{feature: int array of untrimmed lengths} over the first SAMPLE examples, or None when
    the task's preprocessors need the sequence lengths (``data_dir``: part of the cache key,
    since the same name reads another folder's files when it moves)."""
    task = seqio.get_mixture_or_task(task_name)
    # (first: a TFDS task's splits are read from its data dir, which may be a bucket)
    if any(_makes_rows(step) for step in task.preprocessors):
        return None
    if split not in task.splits:  # a mixture member without it: the mixture reads none
        return None
    try:
        ds = task.get_dataset(sequence_length=None, split=split, shuffle=False, num_epochs=1,
                              trim_output_features=False, seed=0)
        rows = list(ds.take(SAMPLE).as_numpy_iterator())
    except (TypeError, ValueError):  # a step that needs sequence_length (an objective)
        return None
    # token sequences only (a class label or a per-example id has no length)
    wanted = [k for k in task.output_features if rows and np.ndim(rows[0].get(k)) == 1]
    return {k: np.array([len(r[k]) for r in rows], np.int64) for k in wanted}


# Steps that take the lengths only to trim to them (what is measured here).
_TRIMMING = (seqio.preprocessors.append_eos_after_trim, seqio.preprocessors.append_eos)


def _makes_rows(step) -> bool:
    """A preprocessor that takes sequence_length for anything but trimming: it makes the
    examples from the lengths (an objective's rows), as seqio decides when to pass them."""
    fn = getattr(step, "func", step)
    if fn in _TRIMMING:
        return False
    try:
        return "sequence_length" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def measure(name: str, split: str, feature_lengths: Mapping[str, int]) -> list[dict]:
    """Per task of ``name`` (a task or mixture), per feature with a length: how many sampled
    examples are longer than that length (and would be cut). Tasks whose rows are made to fit
    are left out."""
    from t5lite import dataprep
    out = []
    for task in seqio.get_subtasks(get_mixture_or_task(name)):
        lengths = _measured(task.name, split, dataprep.data_dir())
        if lengths is None:
            continue
        for feature, limit in feature_lengths.items():
            n = lengths.get(feature)
            if n is None or not n.size:
                continue
            out.append({"task": task.name, "split": split, "feature": feature,
                        "length": int(limit), "sampled": int(n.size),
                        "cut": int((n > limit).sum()), "longest": int(n.max()),
                        "p99": int(np.percentile(n, 99))})
    return out


def _suggested(rows: Sequence[dict], feature_lengths: Mapping[str, int]) -> str:
    """The --set that keeps every sampled example whole (lengths rounded up to 8)."""
    fixed = dict(feature_lengths)
    for r in rows:
        if r["cut"]:
            fixed[r["feature"]] = max(fixed[r["feature"]], -(-r["longest"] // 8) * 8)
    return f"--set 'data.feature_lengths={json.dumps(fixed)}'"


def _describe(r: dict) -> str:
    return (f"{r['task']} {r['split']}: {r['cut']} of {r['sampled']} sampled {r['feature']} "
            f"({100 * r['cut'] / r['sampled']:.0f}%) are longer than data.feature_lengths"
            f"['{r['feature']}']={r['length']} tokens (longest {r['longest']}, 99th "
            f"percentile {r['p99']}, EOS included)")


def check(reads: Sequence[tuple[str, str]], feature_lengths: Mapping[str, int],
          max_trimmed: float, decode_length: int = 0) -> list[str]:
    """Measures each (task or mixture, split) the run reads. Refuses (UserError) when more
    than ``max_trimmed`` of a task's sampled targets would be cut by the targets length, or
    by ``decode_length`` (the predictions' length, when the run decodes): a cut target can
    never be predicted whole, so its sequence metrics are meaningless. Cut inputs are a
    choice the paper's recipes make (CNN/DM articles at 512 tokens): a warning with the
    numbers. -> the lines to log with the run."""
    rows = [r for name, split in dict.fromkeys(reads)
            for r in measure(name, split, feature_lengths)]
    fix = _suggested(rows, feature_lengths)
    # a refusal names the targets length that fits: cut inputs stay the user's choice (a
    # mixture's longest article would otherwise be suggested as every example's length)
    targets_fix = _suggested([r for r in rows if r["feature"] == "targets"], feature_lengths)
    for r in rows:
        if r["feature"] == "targets" and r["cut"] > max_trimmed * r["sampled"]:
            raise UserError(f"{_describe(r)} and would be cut, so no prediction could match "
                            f"them: {targets_fix} (or data.max_trimmed=1.0 to train on cut "
                            "targets).")
        if r["feature"] == "targets" and decode_length and (
                (n := _longer(r, decode_length)) > max_trimmed * r["sampled"]):
            raise UserError(
                f"{r['task']} {r['split']}: {n} of {r['sampled']} sampled targets are longer "
                f"than decode.max_length={decode_length} tokens (longest {r['longest']}), so "
                f"their predictions would be cut: --set decode.max_length={r['longest']} (or "
                "0, to follow data.feature_lengths['targets']).")
    lines = [f"warning: {_describe(r)} and are cut; {fix} keeps them whole."
             for r in rows if r["cut"]]
    fits = [f"{r['task']} {r['split']} {r['feature']} {r['longest']}/{r['length']}"
            for r in rows if not r["cut"]]
    if fits:
        more = f" (+{len(fits) - 6} more)" if len(fits) > 6 else ""
        lines.append(f"lengths: every sampled example fits (longest/length over the first "
                     f"{SAMPLE}): {', '.join(fits[:6])}{more}.")
    return lines


def _longer(row: dict, n: int) -> int:
    """Sampled targets of ``row``'s task and split longer than n tokens."""
    from t5lite import dataprep
    lengths = _measured(row["task"], row["split"], dataprep.data_dir())
    return int((lengths[row["feature"]] > n).sum())
