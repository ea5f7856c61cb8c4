"""Registers t5lite's built-in tasks and mixtures with seqio: exactly the specs of
t5lite/task_catalog.py (task_specs, mixture_specs), each by its recipe. A new built-in task is
a new catalog entry; only a new recipe or objective needs code (registry.OBJECTIVE_STEPS,
formats, classification)."""

from __future__ import annotations

from typing import Optional


from t5lite import task_catalog
from t5lite.tasks import classification, formats, metrics, narang_tasks, paper_data, registry


def register_task(spec: task_catalog.TaskSpec, vocabulary: Optional[str] = None) -> None:
    """One catalog task, with its own vocabulary unless ``vocabulary`` is given."""
    vocab = vocabulary or spec.vocabulary
    if spec.recipe == "pretraining":
        registry.register_pretraining_task(
            spec.name, spec.objective, vocabulary=vocab,
            source=paper_data.pretraining_source(spec, vocab),
            from_lines=paper_data.gives_text_lines(spec), **dict(spec.options))
    elif spec.recipe == "finetune":
        prefix = task_catalog.FINETUNE[spec.source][0]
        registry.register_finetune_task(spec.name, spec.source, prefix,
                                        metrics.by_name(spec.metrics), vocabulary=vocab)
    elif spec.recipe == "classification":
        registry.register_classification_task(spec.name, spec.source,
                                              task_catalog.FINETUNE[spec.source][2],
                                              vocabulary=vocab)
    elif spec.recipe == "decoder_classification":
        classification.register_decoder_classification_task(
            spec.name, spec.source, task_catalog.FINETUNE[spec.source][2], vocabulary=vocab)
    elif spec.recipe == "benchmark":
        register = (narang_tasks.register_paper_task if spec.name in narang_tasks.TASKS
                    else formats.register_paper_task)
        register(spec.name, vocab, spec.metrics)
    else:
        raise ValueError(f"task_catalog: {spec.name} has an unknown recipe {spec.recipe!r}")


def register_mixture(spec: task_catalog.MixtureSpec) -> None:
    rate = spec.rate
    if spec.weights:  # a fixed rate per member
        weights = dict(zip(spec.members, spec.weights))
        rate = lambda task: weights[task.name]  # noqa: E731
    elif spec.fixed:  # some members at a fixed rate, the others at spec.rate
        rate = _partly_fixed(dict(spec.fixed), registry.rate_function(
            spec.rate, spec.cap, spec.temperature))
    registry.register_mixture(spec.name, spec.members, rate, cap=spec.cap,
                              temperature=spec.temperature)


def _partly_fixed(fixed: dict, other):
    """A seqio rate function: ``fixed[name]`` for those members, ``other`` for the rest."""
    def rate(task):
        if task.name in fixed:
            return fixed[task.name]
        return other(task) if callable(other) else other
    return rate


# the vocabulary the `--scale paper` tasks are registered with now
_PAPER_VOCABULARY = {"name": ""}


def register_paper(vocabulary: str = "t5") -> None:
    """The `--scale paper` tasks (C4 and the paper's benchmarks from TFDS) with ``vocabulary``,
    and their mixtures (registered again: a seqio mixture holds its tasks' objects). Nothing is
    read until a dataset is built."""
    for spec in task_catalog.task_specs():
        if spec.paper:
            register_task(spec, vocabulary)
    for mixture in task_catalog.mixture_specs():
        if mixture.paper:
            register_mixture(mixture)
    _PAPER_VOCABULARY["name"] = vocabulary


def use_paper_vocabulary(vocabulary: str) -> None:
    """data.paper_vocabulary: the `--scale paper` tasks of this process with ``vocabulary``,
    registered again only when they have another (training and evaluation call it with their
    config's, so one process running several configs reads each with its own)."""
    if _PAPER_VOCABULARY["name"] != vocabulary:
        register_paper(vocabulary)


def register() -> None:
    """Every built-in task and mixture (the paper's with the t5 vocabulary)."""
    for spec in task_catalog.task_specs():
        if not spec.paper:
            register_task(spec)
    for mixture in task_catalog.mixture_specs():
        if not mixture.paper:
            register_mixture(mixture)
    register_paper()
