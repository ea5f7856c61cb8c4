"""What a study costs before it runs: the training steps and tokens of every stage and, for a
TPU slice, the TPU-hours from AOT compiles: each row's pretraining step and the baseline row's
finetuning steps (a row's finetuning step modelled as the baseline's times the row's
pretraining step ratio), or every stage; stages whose train step is the same share one
compile, and compiles already made (bench/modifications_compile.jsonl) can be read in."""

from __future__ import annotations

import json
from typing import Sequence

from t5lite.ablations.plan import (Stage, check_tasks, default_tasks,
                                   row_training_stages)
from t5lite.ablations.tables import Table, as_table
from t5lite.errors import UserError
from t5lite.monitor import flops as flops_lib
from t5lite.tpu import report as tpu_report


# a compile cache holding this key only reads the stages it holds (preload) and compiles none
OFFLINE = ("offline",)
# what a stage's compiler child runs ("module:function", tpu.isolated); tests name a stand-in
COMPILE_TARGET = "t5lite.tpu.isolated:compile_on_slice"
# a compile cache holding this key calls it with each fresh compile's compiled_line
RECORD = ("record",)


# Config fields no compiled train step reads: the task's name and data source, the number of
# steps and of warm-up steps (constants of the learning-rate schedule: the same program and
# cost), logging, checkpoints, evaluation, decoding, the initializers (initial values only),
# the vocabulary of the paper's tasks (the same ids: model.vocab_size shapes the step), the
# user's task modules and the share of cut targets a run accepts (checks before it starts).
# Finetuning stages alike in everything else (SuperGLUE, WebQuestions and WMT at paper scale:
# batch 128 x (512, 512)) share one compile.
_NOT_IN_STEP = {"": ("name", "checkpoint", "eval", "decode"),
                "data": ("mixture_or_task", "seed", "shuffle", "data_dir", "tfds_data_dir",
                         "cache_dir", "use_cached", "train_split", "eval_split",
                         "paper_vocabulary", "task_modules", "task_module_files",
                         "max_trimmed"),
                "train": ("steps", "log_every", "eval_every", "eval_steps", "prepare_data",
                          "profile_steps", "wandb_project", "wandb_entity", "wandb_mode"),
                "optim": ("warmup_steps",),
                "model": ("initializers",)}


def step_key(cfg) -> str:
    """The part of a stage's config its compiled train step depends on, as a cache key."""
    from t5lite import config as config_lib
    d = config_lib.to_dict(cfg)
    for section, names in _NOT_IN_STEP.items():
        part = d[section] if section else d
        for name in names:
            part.pop(name, None)
    if not d["model"]["dropout_rate"]:  # no dropout: no mask to shape
        d["model"].pop("dropout_broadcast", None)
    return json.dumps(d, sort_keys=True, default=str)


def same_step(line: dict, cfg) -> bool:
    """A compile log's line (bench/modifications_compile.py: its stage's config name and
    overrides) compiled the train step ``cfg`` plans (their step_key agree: a line written
    before a row's plan changed does not)."""
    from t5lite import config as config_lib
    if "overrides" not in line:
        return False
    return step_key(config_lib.load_config(line["config"], line["overrides"])) == step_key(cfg)


def compile_report(stage: Stage, topology: str, cache: dict, row: str = "") -> dict:
    """The AOT compile report of one stage's train step on ``topology`` (what `t5lite compile
    --json` prints), cached by step_key. Each compile runs in a fresh child process
    (tpu.isolated) that exits after it: the compiler's memory is returned between stages (one
    process compiling T5 Large's three train steps outgrew a 24 GB host), and a libtpu crash
    is one stage's error, not the estimate's process. A fresh compile goes to cache[RECORD]
    (when the estimate was given one) as compiled_line(row, stage, topology, report)."""
    key = step_key(stage.cfg)
    if key in cache:
        return cache[key]
    if cache.get(OFFLINE):
        raise UserError(f"{stage.workdir} ({stage.kind}) is not among the compiled stages")
    try:
        from t5lite.tpu import isolated
        from t5lite.mesh.topology import parse_topology, require_libtpu
    except ImportError:
        raise UserError("--topology needs `t5lite compile` (AOT compile for TPU), which "
                        "this install lacks; --estimate without --topology prints the "
                        "steps and tokens.") from None
    topo = parse_topology(topology)
    require_libtpu()
    proc = isolated.CompilerProcess(COMPILE_TARGET)
    try:
        cache[key] = proc.compile(stage.cfg, topo)
    except UserError as e:
        raise UserError(f"t5lite compile failed for {stage.workdir}: {e}") from None
    except Exception as e:  # noqa: BLE001 - XLA and libtpu raise plain runtime errors
        last = (str(e).strip().splitlines() or [""])[-1]
        raise UserError(f"t5lite compile failed for {stage.workdir}: "
                        f"{type(e).__name__}: {last}") from e
    finally:
        proc.close()
    if cache.get(RECORD):
        cache[RECORD](compiled_line(row, stage, topology, cache[key]))
    return cache[key]


def compiled_line(row: str, stage: Stage, topology: str, report: dict) -> dict:
    """A compiled stage as one JSON line of a compile log (what ``preload`` and the compiled
    table read back): the stage's config and overrides beside the report's figures."""
    chips = int(report["chips"])
    flops = report.get("flops_per_chip")
    return {
        "row": row, "stage": stage.workdir.rstrip("/").rsplit("/", 1)[-1],
        "topology": topology, "extra": [], "config": stage.config,
        "overrides": list(stage.overrides),
        "fits": bool(report["fits"]), "compiled": bool(report.get("compiled", True)),
        "chips": chips, "mesh": report.get("mesh"),
        "peak_gib_per_chip": round(report["bytes_per_chip"]["total"] / 2 ** 30, 3),
        "hbm_gib_per_chip": (round(report["hbm_bytes_per_chip"] / 2 ** 30, 2)
                             if report.get("hbm_bytes_per_chip") else None),
        "ops_T": flops * chips / 1e12 if flops is not None else None,
        "model_ops_T": (report["model_flops_per_chip"] * chips / 1e12
                        if report.get("model_flops_per_chip") is not None else None),
        "cost_analysis_ops_T": (report["cost_analysis_flops_per_chip"] * chips / 1e12
                                if report.get("cost_analysis_flops_per_chip") is not None
                                else None),
        "loop_scale": report.get("loop_scale"), "bound": report.get("bound"),
        "roofline_step_seconds": report.get("roofline_step_seconds"),
        "expected_step_seconds": report.get("expected_step_seconds"),
        "expected_mfu": report.get("expected_mfu"),
        "compile_seconds": report.get("compile_seconds"), "xla_error": report.get("xla_error"),
    }


def _baseline_stages(table: Table, tasks: tuple, scale: str,
                     overrides: Sequence[str]) -> dict:
    """{(kind, task): stage} of the baseline row ({} when the table has none)."""
    if not table.baseline:
        return {}
    return {(st.kind, st.task): st for st in row_training_stages(
        table, table.row(table.baseline), "/estimate", tasks, scale, overrides)}


def _fitting_report(table: Table, row_name: str, stage: Stage, topology: str,
                    cache: dict) -> dict:
    report = compile_report(stage, topology, cache, row_name)
    if not report.get("fits", True):
        raise UserError(f"{table.name}/{row_name} {stage.kind} does not fit "
                        f"{topology} ({report.get('bytes_per_chip', {}).get('total')} "
                        f"bytes per chip); try a larger topology or --set "
                        "mesh / remat settings.")
    return report


def _chip_seconds(table: Table, row_name: str, stages: list[Stage], topology: str,
                  cache: dict, baseline: dict | None = None, fits: list | None = None) -> float:
    """Chips x expected step seconds x steps, summed over the stages. With ``baseline`` (the
    baseline row's stages, _baseline_stages): a finetuning stage is not compiled; its step is
    the baseline's compiled step of that stage times this row's pretraining step over the
    baseline's. ``fits`` collects (stage, GiB per chip, expected step) of each compiled one."""
    seconds, ratio = 0.0, None
    pre = next((st for st in stages if st.kind == "pretrain"), None)
    base_pre = (baseline or {}).get(("pretrain", ""))
    for st in stages:
        base = ((baseline or {}).get((st.kind, st.task))
                if st.kind != "pretrain" and pre is not None and base_pre is not None
                else None)
        if base is None:
            report = _fitting_report(table, row_name, st, topology, cache)
            step = float(tpu_report.step_figures(report)[0])
            if fits is not None:
                fits.append((st.task or st.kind, report["bytes_per_chip"]["total"] / 2 ** 30,
                             step))
        else:
            if ratio is None:
                ratio = (_step(table, row_name, pre, topology, cache)
                         / _step(table, table.baseline, base_pre, topology, cache))
            report = _fitting_report(table, table.baseline, base, topology, cache)
            step = float(tpu_report.step_figures(report)[0]) * ratio
        seconds += (st.cfg.train.steps - st.start) * step * int(report["chips"])
    return seconds


def _step(table: Table, row_name: str, stage: Stage, topology: str, cache: dict) -> float:
    """The expected step seconds of a stage that must fit."""
    return float(tpu_report.step_figures(
        _fitting_report(table, row_name, stage, topology, cache))[0])


def preload(cache: dict, lines: Sequence[dict], topology: str) -> int:
    """Put already compiled stages (bench/modifications_compile.py's JSON lines: their stage's
    config and overrides beside the compile's figures) into an estimate's compile cache, so
    the estimate compiles only what they lack; -> how many were taken. Lines of another
    topology, with extra --set overrides or an error are skipped."""
    from t5lite import config as config_lib
    n = 0
    for line in lines:
        if (line.get("topology") != topology or line.get("extra") or "error" in line
                or "overrides" not in line):
            continue
        cfg = config_lib.load_config(line["config"], line["overrides"])
        cache[step_key(cfg)] = {
            "fits": line["fits"], "chips": line["chips"],
            "expected_step_seconds": line.get("expected_step_seconds"),
            "roofline_step_seconds": line.get("roofline_step_seconds"),
            "bytes_per_chip": {"total": round(line["peak_gib_per_chip"] * 1024 ** 3)}}
        n += 1
    return n


def _hours(h: float) -> str:
    return f"{h:,.1f}" if h >= 10 else f"{h:.3g}"  # tiny rows: seconds, not "0.0"


def _print_estimate(table: Table, scale: str, seeds: int, topology: str, rows: dict,
                    total: dict, finetuning: str) -> None:
    head = ["row", "train steps", "tokens"] + (["TPU-hours"] if topology else [])
    lines = [" | ".join(head)]
    for name, e in list(rows.items()) + [("total", total)]:
        hours = e.get("tpu_hours")
        lines.append(" | ".join([name, f"{e['steps']:,}", f"{e['tokens']:.3g}"] + (
            [_hours(hours) if hours is not None else "-"] if topology else [])))
    notes = [f"{name}: {e['not_estimated']}" for name, e in rows.items()
             if e.get("not_estimated")]
    fitted = [f"{name}: " + "; ".join(f"{stage} {gib:.2f} GiB a chip, {step * 1e3:,.1f} ms"
                                      for stage, gib, step in e["fits"])
              for name, e in rows.items() if e.get("fits")]
    how = ""
    if topology:
        how = ("; TPU-hours = chips x the compiled expected step x steps" + (
            ", each finetuning stage's step the baseline's compiled one x the row's "
            "pretraining step / the baseline's (the row's own finetuning is not compiled)"
            if finetuning == "scaled" and table.baseline else ", every stage compiled"))
    print(f"{table.name} at --scale {scale}" + (f" on {topology}" if topology else "")
          + f", {seeds} seed(s); training only (the per-checkpoint evaluations come on top)"
          + how + ":\n" + "\n".join(lines)
          + "".join(f"\nnot in the total: {n}" for n in notes)
          + ("\ncompiled, each fitting (per chip, expected step):\n" + "\n".join(fitted)
             if fitted else ""), flush=True)


def _check_topology(topology: str) -> None:
    """Say once, before any row, that this install cannot compile for a TPU."""
    try:
        from t5lite.mesh.topology import parse_topology, require_libtpu
        import t5lite.tpu.compile  # noqa: F401
    except ImportError:
        raise UserError("--topology needs `t5lite compile` (AOT compile for TPU), which "
                        "this install lacks; --estimate without --topology prints the "
                        "steps and tokens.") from None
    parse_topology(topology)
    require_libtpu()


def estimate(table: str | Table, rows: Sequence[str] = (), tasks: Sequence[str] = (),
             scale: str = "paper", overrides: Sequence[str] = (), seeds: int = 1,
             topology: str = "", finetuning: str = "scaled",
             compiled: Sequence[dict] = (), compile_missing: bool = True,
             record=None) -> dict:
    """Steps and tokens of every training stage of the rows (x seeds), and with ``topology``
    the estimated TPU-hours from the AOT compile (chips x expected_step_seconds x steps); prints a
    table; -> {"rows": {row: {...}}, "total": {...}}. Evaluation is not counted.

    ``finetuning``: "scaled" compiles each row's pretraining stage and the baseline row's
    finetuning stages, and models a row's finetuning step as the baseline's times the row's
    pretraining step ratio (one compile per row instead of one per stage); "compiled" compiles
    every stage. ``compiled``: already compiled stages (``preload``); ``compile_missing=False``
    compiles nothing else; ``record(line)`` is called with each stage compiled here
    (compiled_line: `ablate --compiled FILE` appends it to FILE). A row that does not fit
    or fails to compile gets no TPU-hours and a note, and stays out of the total."""
    table = as_table(table)
    if finetuning not in ("scaled", "compiled"):
        raise UserError(f"finetuning={finetuning!r}: use 'scaled' or 'compiled'")
    selected = [table.row(r) for r in rows] if rows else list(table.rows)
    tasks = tuple(tasks) or default_tasks(table, scale)
    check_tasks(tasks)
    cache, out = {}, {}
    if topology:
        _check_topology(topology)
        preload(cache, compiled, topology)
        cache[OFFLINE] = not compile_missing
        cache[RECORD] = record
    baseline = (_baseline_stages(table, tasks, scale, overrides)
                if topology and finetuning == "scaled" else None)
    for row in selected:
        stages = row_training_stages(table, row, "/estimate", tasks, scale, overrides)
        steps = sum(st.cfg.train.steps - st.start for st in stages) * seeds
        tokens = sum((st.cfg.train.steps - st.start) * flops_lib.tokens_per_step(st.cfg)
                     for st in stages) * seeds
        entry = {"steps": steps, "tokens": tokens}
        if topology:
            try:
                fits = []
                seconds = _chip_seconds(table, row.name, stages, topology, cache, baseline,
                                        fits)
                entry["tpu_hours"] = seconds * seeds / 3600
                entry["fits"] = fits
            except UserError as e:
                entry.update(tpu_hours=None, not_estimated=str(e))
        out[row.name] = entry
    total = {k: sum(e[k] for e in out.values()) for k in ("steps", "tokens")}
    if topology:
        total["tpu_hours"] = sum(e["tpu_hours"] or 0.0 for e in out.values())
    _print_estimate(table, scale, seeds, topology, out, total, finetuning)
    return {"rows": out, "total": total}
