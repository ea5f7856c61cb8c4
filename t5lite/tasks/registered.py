"""`t5lite tasks list | show NAME`: the registered tasks and mixtures, and decoded examples."""

from __future__ import annotations

import seqio

from t5lite.tasks import pipeline
from t5lite.text_table import format_table

DEFAULT_LENGTHS = {"inputs": 128, "targets": 128}


def _vocab_name(vocab) -> str:
    """The model file or class name; never loads the vocabulary (its file may be missing)."""
    path = getattr(vocab, "_rel_path", None) or getattr(vocab, "_sentencepiece_model_file", None)
    return path.rsplit("/", 1)[-1] if path else type(vocab).__name__


def _needs(task) -> list[str]:
    """The local datasets (`t5lite data prepare` names) a task reads: its source files and its
    vocabulary. Empty when it reads nothing t5lite prepares (e.g. TFDS formats)."""
    from t5lite.tasks import registry, vocabularies
    needs = []
    paths = getattr(task.source, "_split_to_filepattern", None)
    if isinstance(paths, registry._LocalPaths):
        needs.append(paths._dataset)
    for feat in task.output_features.values():
        vocab = feat.vocabulary
        name = getattr(vocab, "_prepare_name", None) or {
            vocabularies.GPT2Vocabulary: "vocab_gpt2",
            vocabularies.BertVocabulary: "vocab_bert"}.get(type(vocab))
        if name and name not in needs:
            needs.append(name)
    return needs


def task_rows() -> list[dict]:
    """Per task and mixture: {"cells": [name, kind, features, vocabulary, metrics / members],
    "needs": [dataset, ...]}, from seqio's registries (t5lite/task_catalog.py must agree)."""
    import t5lite.tasks  # noqa: F401
    rows = []
    for name in sorted(seqio.TaskRegistry.names()):
        task = seqio.TaskRegistry.get(name)
        feats = task.output_features
        vocab = (feats.get("inputs") or feats.get("targets")).vocabulary
        metric_names = ",".join(getattr(f, "__name__", "fn") for f in task.metric_fns) or "-"
        rows.append({"cells": [name, "task", ",".join(feats), _vocab_name(vocab), metric_names],
                     "needs": _needs(task)})
    for name in sorted(seqio.MixtureRegistry.names()):
        mix = seqio.MixtureRegistry.get(name)
        needs = list(dict.fromkeys(n for t in mix.tasks for n in _needs(t)))
        rows.append({"cells": [name, "mixture", ",".join(mix.tasks[0].output_features), "",
                               " + ".join(t.name for t in mix.tasks)], "needs": needs})
    return rows


def list_tasks() -> str:
    """One row per task (features, vocabulary, metrics) and per mixture (members)."""
    return format_table([["name", "kind", "features", "vocabulary", "metrics / members"]]
                  + [r["cells"] for r in task_rows()])


def _decode(vocab, ids) -> str:
    """The text of ``ids``, with BERT's [CLS] / [SEP] / [MASK] named where they stand (its
    decode drops them and stops at the first [SEP], which would hide a sentence pair's
    second sentence)."""
    ids = [int(i) for i in ids]
    special = _special_tokens(vocab)
    try:
        parts, run = [], []
        for i in ids + [None]:
            if i is None or i in special:
                parts += [vocab.decode(run)] if run else []
                parts += [special[i]] if i is not None else []
                run = []
            else:
                run.append(i)
        return " ".join(p for p in parts if p)
    except Exception:  # pylint: disable=broad-except
        return str(ids)


def _special_tokens(vocab) -> dict:
    """{id: name} of the tokens a vocabulary's decode leaves out (BERT's)."""
    from t5lite.tasks.vocabularies import BertVocabulary
    if not isinstance(vocab, BertVocabulary):
        return {}
    return {vocab.CLS: "[CLS]", vocab.SEP: "[SEP]", vocab.MASK: "[MASK]"}


def show_task(name: str, split: str = "train", num_examples: int = 3,
              feature_lengths=None, seed: int = 0) -> str:
    """A few preprocessed examples of a task or mixture, token features decoded."""
    provider = pipeline.get_mixture_or_task(name)
    lengths = dict(feature_lengths or DEFAULT_LENGTHS)
    lengths = {k: v for k, v in lengths.items() if k in provider.output_features}
    ds = provider.get_dataset(lengths, split=split, shuffle=False, seed=seed, num_epochs=1)
    out = [f"{name} ({split}), feature lengths {lengths}:"]
    for i, ex in enumerate(ds.take(num_examples).as_numpy_iterator()):
        out.append(f"--- example {i}")
        for key, value in ex.items():
            feat = provider.output_features.get(key)
            if feat is not None and not isinstance(feat.vocabulary, seqio.PassThroughVocabulary) \
                    and getattr(value, "ndim", 0) == 1:
                out.append(f"{key} ({len(value)} tokens): {_decode(feat.vocabulary, value)}")
            elif key.endswith("_pretokenized"):
                continue
            else:
                text = value.tolist() if hasattr(value, "tolist") else value
                if isinstance(text, bytes):
                    text = text.decode("utf-8", "replace")
                out.append(f"{key}: {text}")
    return "\n".join(out)


def user_rows() -> dict:
    """{name: (task_catalog.Row, data cell)} of each task and mixture the user's task modules
    registered (tasks/user_modules.py), for `t5lite tasks list --task-module`. The data cell
    is "ready" when every file pattern of every split matches a file, else the first that
    does not."""
    from t5lite import task_catalog
    from t5lite.tasks import preflight, user_modules
    out = {}
    for name in sorted(user_modules.REGISTERED_BY):
        provider = pipeline.get_mixture_or_task(name)
        tasks = seqio.get_subtasks(provider)
        missing = [p for t in tasks for p in preflight.missing_files(t, t.splits)]
        data = "ready" if not missing else f"missing {missing[0]}"
        if isinstance(provider, seqio.Mixture):
            row = task_catalog.Row(name, "mixture", tuple(sorted(tasks[0].output_features)),
                                   "", members=tuple(sorted(t.name for t in tasks)))
        else:
            feats = provider.output_features
            vocab = (feats.get("inputs") or feats.get("targets")).vocabulary
            metric_names = tuple(getattr(f, "__name__", "fn") for f in provider.metric_fns)
            row = task_catalog.Row(name, "task", tuple(sorted(feats)), _vocab_name(vocab),
                                   metric_names)
        out[name] = (row, data)
    return out

