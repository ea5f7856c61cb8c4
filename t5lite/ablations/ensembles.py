"""Ensemble rows (the T5 paper's Table 13): the members' finetuned params of one task decoded
together, with the mean of their logits at every step (eval.decoding.ensemble), on the
scale's report split. Per-checkpoint selection (paper scale) evaluates the ensemble at each
step every member kept and reports the best on validation, as for one model."""

from __future__ import annotations

import shlex
from typing import Sequence

from t5lite.ablations.files import join_path, read_json, write_json
from t5lite.ablations.paper import DOWNSTREAM
from t5lite.ablations.plan import Stage, eval_checkpoint, eval_tasks, get_scale
from t5lite.errors import UserError


def _evaluate(checkpoints: Sequence[str], task: str, split: str, max_examples: int) -> dict:
    from t5lite.eval import evaluation
    print(f"  {split} {task} <- ensemble of {' + '.join(checkpoints)}", flush=True)
    cfg, model, params = evaluation.load_ensemble(checkpoints)
    metrics = evaluation.evaluate(cfg, model, params, tasks=(task,), split=split,
                                  max_examples=max_examples)
    return {k: float(v) for k, v in metrics.items()}


def _common_steps(workdirs: Sequence[str]) -> list[int]:
    """The checkpoint steps every member kept."""
    from etils import epath
    steps = None
    for w in workdirs:
        d = epath.Path(w, "checkpoints")
        kept = {int(p.name) for p in d.iterdir() if p.name.isdigit()} if d.exists() else set()
        steps = kept if steps is None else steps & kept
    return sorted(steps or ())


def _mean(task: str, metrics: dict) -> float:
    vals = [v for k, v in metrics.items() if k.startswith(task + "/")]
    return sum(vals) / len(vals) if vals else float("-inf")


def _best_step(members: Sequence[Stage], task: str, split: str, max_examples: int) -> dict:
    """The ensemble at each common kept step on validation; the best one's metrics on split."""
    dirs = [ft.workdir for ft in members]
    best, best_step = None, None
    for step in _common_steps(dirs):
        ckpts = [join_path(d, "checkpoints", str(step)) for d in dirs]
        m = _evaluate(ckpts, task, "validation", members[0].cfg.eval.max_examples)
        if best is None or _mean(task, m) > _mean(task, best):
            best, best_step = m, step
    if best is None:
        raise UserError(f"the members {', '.join(dirs)} share no kept checkpoint step.")
    if split != "validation":
        best = _evaluate([join_path(d, "checkpoints", str(best_step)) for d in dirs], task,
                         split, max_examples)
    return {**best, f"{task}/checkpoint_step": float(best_step)}


def test(row_path: str, members: Sequence[Stage], scale: str, per_checkpoint: bool) -> dict:
    """One downstream task's metrics of the ensemble of ``members`` (its finetuning stages),
    cached as ensemble_<split>_<task>.json in the row's directory."""
    split = get_scale(scale).report_split
    task = members[0].task
    path = join_path(row_path, f"ensemble_{split}_{task}.json")
    cached = read_json(path)
    if cached is not None:
        return cached
    n = DOWNSTREAM[task].test_examples if split == "test" else 0
    metrics = {}
    for t in eval_tasks(task):
        if per_checkpoint:
            metrics.update(_best_step(members, t, split, n))
        else:
            metrics.update(_evaluate([eval_checkpoint(ft) for ft in members], t, split, n))
    write_json(path, metrics)
    return metrics


def eval_line(members: Sequence[Stage], scale: str, per_checkpoint: bool) -> str:
    """What a dry run prints for an ensemble's evaluation (no `t5lite eval` line does it)."""
    split = get_scale(scale).report_split
    ckpts = [join_path(ft.workdir, "checkpoints", "STEP") if per_checkpoint
             else eval_checkpoint(ft) for ft in members]
    how = " at every common STEP, the best on validation" if per_checkpoint else ""
    return (f"# ensemble of {len(members)} (mean logits, greedy) on "
            f"{', '.join(eval_tasks(members[0].task))} --split {split}{how}: "
            + " ".join(shlex.quote(c) for c in ckpts))
