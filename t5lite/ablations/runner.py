"""Running a table: per row and seed, train its stages (each skipped when done earlier), test
them on the scale's report split, and keep the row's result.json and the table's table.md."""

from __future__ import annotations

import json
import math
import time
from typing import Optional, Sequence

from t5lite import config as config_lib
from t5lite.ablations import ensembles
from t5lite.ablations.files import join_path, read_json, row_dir, write_json
from t5lite.ablations.paper import DOWNSTREAM
from t5lite.ablations.plan import (Stage, check_splits, check_tasks, default_tasks,
                                   eval_checkpoint,
                                   eval_command_line, eval_overrides, eval_tasks, get_scale,
                                   per_checkpoint_selection, plan_members, plan_row,
                                   row_training_stages, training_stages)
from t5lite.ablations.pretrain_columns import pretraining_metrics
from t5lite.ablations.rendering import render, write_table
from t5lite.ablations.tables import Row, Table, as_table
from t5lite.errors import UserError


def check_same_config(stage: Stage) -> None:
    """A stage's workdir may only be resumed with the config it was started with: the
    trainer's diff (workdir.config_diff: placement keys such as mesh.* may differ), with no
    safe-key exception (a finished stage's numbers are reused)."""
    from t5lite.store import workdir as workdir_lib
    old = read_json(join_path(stage.workdir, "config.json"))
    if old is None:
        return
    diff = workdir_lib.config_diff(old, json.loads(json.dumps(config_lib.to_dict(stage.cfg))))
    if diff:
        raise UserError(f"{stage.workdir} was started with a different config "
                        f"({workdir_lib.format_diff(diff, 5)}). Use another --workdir, or "
                        "delete that directory to redo the stage.")


def _train(stage: Stage) -> float:
    """Train the stage unless done; -> seconds spent (0 when skipped)."""
    from t5lite.train import trainer
    check_same_config(stage)
    what = f"{stage.kind}{' ' + stage.task if stage.task else ''}"
    if read_json(join_path(stage.workdir, "ablation_done.json")) is not None:
        print(f"  {what}: done earlier, skipped", flush=True)
        return 0.0
    print(f"  {what} -> {stage.workdir}", flush=True)
    t0 = time.time()
    trainer.train(stage.cfg, stage.workdir)
    seconds = time.time() - t0
    write_json(join_path(stage.workdir, "ablation_done.json"), {"seconds": seconds})
    return seconds


def _checkpoint_steps(workdir: str) -> list[int]:
    from etils import epath
    d = epath.Path(workdir, "checkpoints")
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


def benchmark_average(task: str, metrics: dict) -> dict:
    """A benchmark of several tasks (GLUE, SuperGLUE): add "<task>/average", the paper's score:
    the mean over the benchmark's score groups of each group's mean metric (MRPC's F1 and
    accuracy are one group, MNLI's matched and mismatched accuracy another: T5's
    compute_avg_glue). UserError when a group's metric is missing: a score over fewer tasks
    is not the paper's."""
    groups = DOWNSTREAM[task].score
    if not groups:
        return metrics
    missing = [k for _, keys in groups for k in keys if k not in metrics]
    if missing:
        raise UserError(f"{task}'s score needs {', '.join(missing)}, which the evaluation did "
                        "not report; evaluate every member task (DOWNSTREAM members).")
    means = [sum(metrics[k] for k in keys) / len(keys) for _, keys in groups]
    return {**metrics, DOWNSTREAM[task].metrics[0]: sum(means) / len(means)}


def selection_groups(task: str) -> list[tuple]:
    """The evaluated tasks of a DOWNSTREAM task, grouped as the paper chooses checkpoints: a
    benchmark score group's tasks (MNLI matched and mismatched) share the checkpoint best on
    their mean (T5's metric_group_max); every other task is chosen alone."""
    groups, seen = [], set()
    for _, keys in DOWNSTREAM[task].score:
        tasks = tuple(dict.fromkeys(k.split("/")[0] for k in keys))
        groups.append(tasks)
        seen.update(tasks)
    return groups + [(t,) for t in eval_tasks(task) if t not in seen]


def _selection_metric(tasks: Sequence[str], metrics: dict) -> float:
    """The number a group of member tasks' best checkpoint is chosen by: the mean of their
    metrics (T5's metric group mean: MRPC's F1 and accuracy, SQuAD's EM and F1, ...); -inf
    when undefined (no metric, or a NaN one: STS-B's correlation of constant predictions),
    so that any defined checkpoint beats it (T5 fills NaN with -1e9)."""
    vals = [v for k, v in metrics.items() if k.split("/")[0] in tasks
            and not k.endswith("/checkpoint_step")]
    mean = sum(vals) / len(vals) if vals else float("nan")
    return float("-inf") if math.isnan(mean) else mean


def _best_checkpoint_metrics(src: str, tasks: Sequence[str], split: str, max_examples: int,
                             validation_examples: int, overrides: Sequence[str]) -> dict:
    """Evaluate every kept checkpoint of ``src`` on validation (``validation_examples``) and
    report the best one's metrics on ``split`` for all ``tasks`` (chosen together), with
    "<task>/checkpoint_step" for each."""
    from t5lite.eval import evaluation
    tasks = tuple(tasks)
    best, best_step = None, None
    for step in _checkpoint_steps(src):
        ckpt = join_path(src, "checkpoints", str(step))
        print(f"  validate {' + '.join(tasks)} <- {ckpt}", flush=True)
        cfg, model, params = evaluation.load(ckpt, overrides)
        m = evaluation.evaluate(cfg, model, params, tasks=tasks, split="validation",
                                max_examples=validation_examples)
        if best is None or _selection_metric(tasks, m) > _selection_metric(tasks, best):
            best, best_step = m, step
    if best is None:
        raise UserError(f"{src} has no checkpoints to choose from.")
    if split != "validation":
        cfg, model, params = evaluation.load(join_path(src, "checkpoints", str(best_step)),
                                             overrides)
        best = evaluation.evaluate(cfg, model, params, tasks=tasks, split=split,
                                   max_examples=max_examples)
    return {**{k: float(v) for k, v in best.items()},
            **{f"{t}/checkpoint_step": float(best_step) for t in tasks}}


def _test(pre: Optional[Stage], ft: Stage, multitask: bool, scale: str = "tiny",
          per_checkpoint: bool = False) -> dict:
    """The task's reported metrics (the scale's report split), cached as <split>_<task>.json
    in the evaluated stage's workdir (so deleting a stage to redo it drops its numbers too).

    per_checkpoint: every kept checkpoint of the evaluated stage is evaluated on validation
    (eval.max_examples of the task's finetuning config; the whole split at paper scale) and
    each (member) task reports its best one (the paper's selection); else the finetuning run's
    best params (or the multi-task run's final ones)."""
    from t5lite.eval import evaluation
    split = get_scale(scale).report_split
    src = pre.workdir if multitask else ft.workdir
    path = join_path(src, f"{split}_{ft.task}.json")
    cached = read_json(path)
    if cached is not None:
        return cached
    n = DOWNSTREAM[ft.task].test_examples if split == "test" else 0
    sets = eval_overrides(ft) if multitask else ()
    metrics = {}
    if per_checkpoint:
        for tasks in selection_groups(ft.task):
            metrics.update(_best_checkpoint_metrics(src, tasks, split, n,
                                                    ft.cfg.eval.max_examples, sets))
    else:
        for task in eval_tasks(ft.task):
            ckpt = pre.workdir if multitask else eval_checkpoint(ft)
            print(f"  {split} {task} <- {ckpt}", flush=True)
            cfg, model, params = evaluation.load(ckpt, sets)
            m = evaluation.evaluate(cfg, model, params, tasks=(task,), split=split,
                                    max_examples=n)
            metrics.update({k: float(v) for k, v in m.items()})
    metrics = benchmark_average(ft.task, metrics)
    write_json(path, metrics)
    return metrics


def summarize(runs: dict) -> tuple[dict, dict]:
    """{seed: metrics} -> (mean, sample standard deviation; 0 for one run) per metric."""
    keys = sorted({k for m in runs.values() for k in m})
    mean, std = {}, {}
    for k in keys:
        vals = [m[k] for m in runs.values() if k in m]
        mean[k] = sum(vals) / len(vals)
        std[k] = (math.sqrt(sum((v - mean[k]) ** 2 for v in vals) / (len(vals) - 1))
                  if len(vals) > 1 else 0.0)
    return mean, std


def _plan_seed(table: Table, row: Row, workdir: str, tasks: Sequence[str], scale: str,
               overrides: Sequence[str], seed: int, per_checkpoint: bool):
    """-> (the stages to train, the evaluation lines of a dry run, a function that tests the
    trained stages -> metrics); an ensemble row's members are tested together."""
    if row.ensemble:
        stages = row_training_stages(table, row, workdir, tasks, scale, overrides, seed)
        _, members = plan_members(table, row, workdir, tasks, scale, overrides, seed)
        by_task = [[fts[i] for _, fts in members] for i in range(len(tasks))]
        lines = [ensembles.eval_line(fts, scale, per_checkpoint) for fts in by_task]
        path = row_dir(workdir, table, row, seed)
        return stages, lines, lambda: {
            k: v for fts in by_task for k, v in benchmark_average(
                fts[0].task, ensembles.test(path, fts, scale, per_checkpoint)).items()}
    pre, fts = plan_row(table, row, workdir, tasks, scale, overrides, seed)
    lines = [eval_command_line(pre, ft, row.multitask, scale, per_checkpoint) for ft in fts]
    return training_stages(pre, fts, row), lines, lambda: {
        **(pretraining_metrics(pre) if table.pretrain_columns and pre else {}),
        **{k: v for ft in fts for k, v in _test(pre, ft, row.multitask, scale,
                                                per_checkpoint).items()}}


def _run_seeds(table: Table, row: Row, workdir: str, tasks: Sequence[str], scale: str,
               overrides: Sequence[str], dry_run: bool, seeds: int) -> tuple[dict, dict, list]:
    """Train and test the row once per seed (dry_run: print the commands instead); -> (runs
    {seed: metrics}, seconds {stage[@seed]: seconds trained}, the train commands)."""
    per_checkpoint = per_checkpoint_selection(scale, row)
    runs, seconds, commands = {}, {}, []
    for seed in range(seeds):
        stages, lines, test = _plan_seed(table, row, workdir, tasks, scale, overrides, seed,
                                         per_checkpoint)
        commands += [st.command() for st in stages]
        if dry_run:
            print("\n".join([st.command() for st in stages] + lines), flush=True)
            continue
        row_path = row_dir(workdir, table, row, seed)
        for st in stages:
            key = st.workdir[len(row_path) + 1:]  # pretrain, finetune_<task>, member0/...
            t = _train(st)
            if t:
                seconds[f"{key}@{seed}" if seed else key] = t
        runs[str(seed)] = test()
    return runs, seconds, commands


def _record_row(table: Table, row: Row, workdir: str, scale: str, runs: dict, seconds: dict,
                commands: list) -> dict:
    """Merge this call's runs into the row's result.json (the seeds of earlier calls stay);
    -> the row's result. The file is rewritten only when it changes."""
    path = join_path(row_dir(workdir, table, row), "result.json")
    old = read_json(path) or {}
    old_runs = old.get("runs") or ({"0": old["metrics"]} if old.get("metrics") else {})
    all_runs = {**old_runs, **runs}
    mean, std = summarize(all_runs)
    result = {
        "table": table.name, "row": row.name, "label": list(row.label),
        "baseline": row.name == table.baseline, "scale": scale,
        "split": get_scale(scale).report_split,
        "metrics": mean, "std": std, "runs": all_runs,
        "seconds": {**old.get("seconds", {}), **seconds},
        "commands": commands}
    if result != old:
        write_json(path, result)
    return result


def run(table: str | Table, workdir: str, rows: Sequence[str] = (), tasks: Sequence[str] = (),
        scale: str = "tiny", overrides: Sequence[str] = (), dry_run: bool = False,
        seeds: int = 1) -> dict:
    """Run (or, dry_run, print) the table's rows, each ``seeds`` times (train.seed and
    data.seed 0 .. seeds - 1); -> {row name: result}. See the package doc."""
    table = as_table(table)
    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}.")
    from t5lite.store import checkpointing
    workdir = checkpointing.abspath(workdir)
    selected = [table.row(r) for r in rows] if rows else list(table.rows)
    tasks = tuple(tasks) or default_tasks(table, scale)
    check_tasks(tasks)
    check_splits(tasks, scale)
    results = {}
    from t5lite import progress  # rows done / to do (a bar, or plain lines in a log file)
    for row in progress.bar(selected, desc=f"ablate {table.name}", unit="row",
                            disable=dry_run):
        print(f"# {table.name} / {row.name}: {' | '.join(row.label)}", flush=True)
        runs, seconds, commands = _run_seeds(table, row, workdir, tasks, scale, overrides,
                                             dry_run, seeds)
        if dry_run:
            continue
        results[row.name] = _record_row(table, row, workdir, scale, runs, seconds, commands)
        write_table(table, workdir)
    if results:
        print(render(table, workdir)
              + f"\n(written to {join_path(workdir, table.name, 'table.md')})", flush=True)
    return results
