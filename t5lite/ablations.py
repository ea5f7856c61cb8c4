"""The T5 paper's ablation tables (Raffel et al. 2020) as data, a runner, and a renderer.

A Table (configs/ablations/tableN.py) names a pretraining config, the finetuning configs of
its downstream tasks (DOWNSTREAM) and rows; a Row is the paper's label plus config overrides
for the pretraining and/or finetuning stage, in `--set` syntax. `key:=expr` computes the value
from the stage's config as it stands at that point (``cfg``, ``L`` = inputs length, and the
helpers in _namespace), so a row such as "half the layers" or "targets long enough for 50%
corruption" holds at any scale.

Overrides of a stage apply in this order (later wins):
    base config file <- DOWNSTREAM task (finetuning) <- SCALES[scale] <- user `--set`
    (`pretrain.KEY=V` / `finetune.KEY=V`: one stage) <- table <- row (both stages, then this
    stage).
The user's overrides adjust the scale (model size, steps, lengths, data dir) under every row,
so a row's `:=` values follow them and the row's own change always holds.

`run` does, per row: pretrain into WORKDIR/<table>/<row>/pretrain; finetune on each task into
.../finetune_<task> (from the pretrained params); evaluate the best params (by the task's
validation metric) on the held-out test split; write .../result.json; re-render
WORKDIR/<table>/table.md. Every stage resumes from its workdir and a finished one is skipped,
so a rerun picks up where the last one stopped. `dry_run` prints the equivalent
`t5lite train` / `t5lite eval` commands instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import math
import os
import shlex
import time
from typing import Optional, Sequence

from t5lite import config as config_lib
from t5lite.errors import UserError

# ----------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a paper table. ``label``: the paper's text, one entry per label column."""

    name: str  # id: `--rows NAME`, the directory WORKDIR/<table>/<name>
    label: tuple
    pretrain: tuple = ()  # overrides of the pretraining stage
    finetune: tuple = ()  # overrides of every finetuning stage
    both: tuple = ()  # overrides of both stages (the model: architecture, sizes, ...)
    multitask: bool = False  # no finetuning: evaluate the pretrained (multi-task) params


@dataclasses.dataclass(frozen=True)
class Table:
    name: str  # "table6": the file configs/ablations/table6.py, the directory WORKDIR/table6
    caption: str  # the paper's caption (shortened)
    label_columns: tuple  # header(s) of the label column(s), e.g. ("Corruption rate",)
    rows: tuple
    baseline: str = ""  # the row marked ★ (the paper's baseline); "" = none
    pretrain_config: str = "quickstart"
    pretrain: tuple = ()  # overrides of every row's pretraining stage
    finetune: tuple = ()  # ... and finetuning stages
    tasks: tuple = ("sentiment",)  # default downstream tasks (keys of DOWNSTREAM)

    def __post_init__(self):
        names = [r.name for r in self.rows]
        if len(set(names)) != len(names):
            raise UserError(f"{self.name}: duplicate row names in {names}")
        if self.baseline and self.baseline not in names:
            raise UserError(f"{self.name}: baseline {self.baseline!r} is not a row")
        for r in self.rows:
            if len(r.label) != len(self.label_columns):
                raise UserError(f"{self.name}/{r.name}: label {r.label} needs "
                                f"{len(self.label_columns)} entries ({self.label_columns})")

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise UserError(f"{self.name} has no row {name!r}."
                        + _did_you_mean(name, [r.name for r in self.rows])
                        + f" Rows: {', '.join(r.name for r in self.rows)}.")


@dataclasses.dataclass(frozen=True)
class Downstream:
    """How to finetune and test on one local task (the paper: GLUE, CNN/DM, WMT, ...)."""

    config: str  # finetuning config file (keeps the best params by `eval.best_metric`)
    overrides: tuple  # task-specific overrides of that config
    metrics: tuple  # metrics shown in the table (the paper: one per benchmark)
    test_examples: int = 0  # held-out examples decoded for the result (0 = the whole split)


DOWNSTREAM = {
    "sentiment": Downstream("quickstart_finetune", (), ("sentiment/accuracy",)),
    "translate_en_de": Downstream("finetune_translate_en_de", (), ("translate_en_de/bleu",),
                                  500),
    "summarize_debian": Downstream("quickstart_finetune", (
        "data.mixture_or_task=summarize_debian",
        "data.feature_lengths={'inputs': 128, 'targets': 32}", "data.pack=True",
        "train.prepare_data=('summarize_debian', 'vocab_sp8k')",
        "optim.learning_rate=1e-3", "eval.best_metric=summarize_debian/rouge2",
        "eval.max_examples=200", "decode.max_length=32"), ("summarize_debian/rouge2",), 500),
}


@dataclasses.dataclass(frozen=True)
class Scale:
    pretrain: tuple = ()
    finetune: tuple = ()


_T5_BASE = ("model.d_model=768", "model.num_heads=12", "model.head_dim=64", "model.d_ff=3072",
            "model.num_encoder_layers=12", "model.num_decoder_layers=12", "model.ffn=relu",
            "model.tie_embeddings=True", "model.scale_tied_logits=True",
            "model.dropout_rate=0.1", "model.dtype=bfloat16", "data.batch_size=128")
SCALES = {
    # CPU: tiny T5 v1.1 (2+2 layers, d_model 128, 8k vocabulary), 128-token inputs. Sized
    # for ~3-6 minutes per row (sentiment only) on 2 idle cores: configs/quickstart.py measured
    # ~1 s per pretraining step there; the finetuning steps are cheaper (64 + 4 tokens).
    "tiny": Scale(
        pretrain=("train.steps=150", "checkpoint.every_steps=50", "train.eval_every=0"),
        finetune=("train.steps=150", "eval.every_steps=50", "checkpoint.every_steps=50")),
    # The paper's setting (Section 3.1): T5 base (v1.0: 12+12 layers, d_model 768, ReLU, tied
    # head), batch 128, 512 input tokens, 2^18 steps of pretraining (inverse square root LR,
    # 10^4 warmup) and of finetuning (constant LR 1e-3), checkpoints every 5,000 steps and the
    # best one by validation. The vocabulary stays the local 8k one; use a TPU / GPU slice.
    "paper": Scale(
        pretrain=_T5_BASE + ("train.steps=262144", "optim.warmup_steps=10000",
                             "data.feature_lengths={'inputs': 512, 'targets': 114}",
                             "checkpoint.every_steps=5000", "train.eval_every=5000"),
        finetune=_T5_BASE + ("train.steps=262144", "optim.learning_rate=1e-3",
                             "eval.every_steps=5000", "checkpoint.every_steps=5000")),
}

# The paper's baseline objective (Section 3.1.4): i.i.d. 15% corruption, each corrupted span
# replaced by one sentinel ("replace corrupted spans"). The tables other than 4 start here.
BASELINE_PRETRAIN = ("data.mixture_or_task=corpus_iid_denoising",
                     "data.feature_lengths.targets:=iid_targets(L, 0.15)")


# ----------------------------------------------------------------------------- overrides


def _round_up(n: float, k: int = 8) -> int:
    return int(math.ceil(n / k) * k)


def iid_targets(inputs_length: int, density: float) -> int:
    """Targets length for i.i.d. corruption with spans -> sentinels on inputs_length - 1
    tokens: noise + one sentinel per noise run (expected n d (1 - d)) + EOS, 25% headroom."""
    n = inputs_length - 1
    return _round_up(1.25 * (n * density + n * density * (1 - density) + 1))


def drop_targets(inputs_length: int, density: float) -> int:
    """Targets length for "drop corrupted tokens" (the dropped tokens + EOS), 25% headroom."""
    n = int((inputs_length - 1) / (1.0 - density))
    return _round_up(1.25 * (n * density + 1))


def span_targets(inputs_length: int, density: float, mean_span: float) -> int:
    """Exact targets length for span corruption (seqio's random_spans_helper)."""
    from t5lite.tasks.objectives import random_spans_helper
    return random_spans_helper(inputs_length, density, mean_span)[1]


def num_layers(cfg) -> int:
    """Layer groups opened one by one under gradual unfreezing."""
    from t5lite.models.peft import total_layers
    return total_layers(cfg)


def _namespace(cfg) -> dict:
    return {"cfg": cfg, "L": cfg.data.feature_lengths.get("inputs", 0),
            "iid_targets": iid_targets, "drop_targets": drop_targets,
            "span_targets": span_targets, "num_layers": num_layers,
            "min": min, "max": max, "int": int, "round": round}


def resolve(base: str, layers: Sequence[str]) -> tuple[list[str], config_lib.Config]:
    """Apply ``layers`` (key=value or key:=expr) to the config file ``base``; -> (plain
    key=value overrides, each key once, equivalent to ``layers``; the validated Config)."""
    base_cfg = config_lib.load_config(base)
    plain = []
    for item in layers:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"override {item!r} must look like key=value or key:=expression")
        key, value = key.strip(), value.strip()
        if key.endswith(":"):
            cfg = config_lib.apply_overrides(base_cfg, plain)
            try:
                value = repr(eval(value, {"__builtins__": {}}, _namespace(cfg)))  # noqa: S307
            except Exception as e:
                raise UserError(f"cannot compute {item!r}: {type(e).__name__}: {e}") from None
            key = key[:-1]
        plain.append(f"{key}={value}")
    last = {p.partition("=")[0]: i for i, p in enumerate(plain)}
    plain = [p for i, p in enumerate(plain) if last[p.partition("=")[0]] == i]
    cfg = config_lib.apply_overrides(base_cfg, plain)
    config_lib.validate(cfg)
    return plain, cfg


def split_user_overrides(overrides: Sequence[str]) -> dict:
    """`--set` items -> {"pretrain": [...], "finetune": [...]}; a `pretrain.` / `finetune.`
    prefix picks one stage, anything else goes to both."""
    out = {"pretrain": [], "finetune": []}
    for item in overrides:
        stage = item.split(".", 1)[0]
        if stage in out:
            out[stage].append(item.split(".", 1)[1])
        else:
            for v in out.values():
                v.append(item)
    return out


# ----------------------------------------------------------------------------- tables


def tables_dir() -> str:
    return os.path.join(config_lib.configs_dir(), "ablations")


def table_names() -> list[str]:
    names = [f[:-3] for f in os.listdir(tables_dir())
             if f.endswith(".py") and not f.startswith("_")]
    return sorted(names, key=lambda n: (len(n), n))


def load_table(name: str) -> Table:
    """`table6`, `6`, or a path to a file defining TABLE."""
    path = name if name.endswith(".py") and os.path.isfile(name) else os.path.join(
        tables_dir(), (name if name.startswith("table") else f"table{name}") + ".py")
    if not os.path.isfile(path):
        raise UserError(f"no ablation table {name!r}." + _did_you_mean(name, table_names())
                        + f" Tables: {', '.join(table_names())} (`t5lite ablate --list`).")
    spec = importlib.util.spec_from_file_location("t5lite_ablation_" + os.path.basename(
        path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not isinstance(getattr(module, "TABLE", None), Table):
        raise UserError(f"{path} must define TABLE = t5lite.ablations.Table(...)")
    return module.TABLE


def list_tables() -> str:
    lines = []
    for name in table_names():
        t = load_table(name)
        lines.append(f"{t.name}: {t.caption}")
        for r in t.rows:
            star = "★ " if r.name == t.baseline else "  "
            lines.append(f"  {star}{r.name:<22} {' | '.join(r.label)}")
    return "\n".join(lines)


def _did_you_mean(name, known) -> str:
    hint = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    return f" Did you mean: {', '.join(hint)}?" if hint else ""


# ----------------------------------------------------------------------------- plan


@dataclasses.dataclass
class Stage:
    kind: str  # "pretrain" | "finetune"
    config: str  # base config file
    workdir: str
    overrides: list  # plain key=value, exactly what `t5lite train --set` gets
    cfg: config_lib.Config
    task: str = ""  # finetune: the downstream task

    def command(self) -> str:
        cfg = self.config if self.config.endswith(".py") else f"configs/{self.config}.py"
        return " ".join(["t5lite train", "--config", cfg, "--workdir", shlex.quote(self.workdir)]
                        + [f"--set {shlex.quote(o)}" for o in self.overrides])


def _join(*parts) -> str:
    return "/".join(p.rstrip("/") for p in parts)


def plan_row(table: Table, row: Row, workdir: str, tasks: Sequence[str], scale: str = "tiny",
             overrides: Sequence[str] = ()) -> tuple[Stage, list[Stage]]:
    """-> (pretraining stage, one finetuning stage per task). A multi-task row trains no
    finetuning stage; its test decoding follows the task's finetuning config."""
    if scale not in SCALES:
        raise UserError(f"unknown scale {scale!r}; one of {', '.join(SCALES)}.")
    sc, user = SCALES[scale], split_user_overrides(overrides)
    row_dir = _join(workdir, table.name, row.name)
    layers = (list(sc.pretrain) + user["pretrain"] + list(table.pretrain) + list(row.both)
              + list(row.pretrain))
    plain, cfg = resolve(table.pretrain_config, layers)
    pre = Stage("pretrain", table.pretrain_config, _join(row_dir, "pretrain"), plain, cfg)
    stages = []
    for task in tasks:
        d = DOWNSTREAM[task]
        layers = (list(d.overrides) + list(sc.finetune) + user["finetune"] + list(table.finetune)
                  + list(row.both) + list(row.finetune) + [f"checkpoint.init_from={pre.workdir}"])
        plain, cfg = resolve(d.config, layers)
        stages.append(Stage("finetune", d.config, _join(row_dir, f"finetune_{task}"), plain,
                            cfg, task))
    return pre, stages


def _eval_checkpoint(stage: Stage) -> str:
    return _join(stage.workdir, "best") if stage.cfg.eval.best_metric else stage.workdir


def _eval_overrides(ft: Stage) -> list[str]:
    """Evaluating multi-task params on a task: decode as that task's finetuning would."""
    return [f"decode.max_length={ft.cfg.decode.max_length}",
            f"eval.batch_size={ft.cfg.eval.batch_size}"]


def eval_command(pre: Stage, ft: Stage, multitask: bool) -> str:
    ckpt = pre.workdir if multitask else _eval_checkpoint(ft)
    n = DOWNSTREAM[ft.task].test_examples
    sets = _eval_overrides(ft) if multitask else []
    return " ".join([f"t5lite eval --checkpoint {shlex.quote(ckpt)} --task {ft.task} "
                     "--split test"] + ([f"--max-examples {n}"] if n else [])
                    + [f"--set {shlex.quote(o)}" for o in sets])


# ----------------------------------------------------------------------------- run


def _read_json(path: str) -> Optional[dict]:
    from etils import epath
    p = epath.Path(path)
    return json.loads(p.read_text()) if p.exists() else None


def _write_json(path: str, obj) -> None:
    import jax
    from etils import epath
    if jax.process_index() == 0:
        epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
        epath.Path(path).write_text(json.dumps(obj, indent=2))


def _check_same_config(stage: Stage) -> None:
    """A stage's workdir may only be resumed with the config it was started with: the
    trainer's diff (workdir.config_diff: placement keys such as mesh.* may differ), with no
    safe-key exception (a finished stage's numbers are reused)."""
    from t5lite import workdir as workdir_lib
    old = _read_json(_join(stage.workdir, "config.json"))
    if old is None:
        return
    diff = workdir_lib.config_diff(old, json.loads(json.dumps(config_lib.to_dict(stage.cfg))))
    if diff:
        raise UserError(f"{stage.workdir} was started with a different config "
                        f"({workdir_lib.format_diff(diff, 5)}). Use another --workdir, or "
                        "delete that directory to redo the stage.")


def _train(stage: Stage) -> float:
    """Train the stage unless done; -> seconds spent (0 when skipped)."""
    from t5lite import trainer
    _check_same_config(stage)
    what = f"{stage.kind}{' ' + stage.task if stage.task else ''}"
    if _read_json(_join(stage.workdir, "ablation_done.json")) is not None:
        print(f"  {what}: done earlier, skipped", flush=True)
        return 0.0
    print(f"  {what} -> {stage.workdir}", flush=True)
    t0 = time.time()
    trainer.train(stage.cfg, stage.workdir)
    seconds = time.time() - t0
    _write_json(_join(stage.workdir, "ablation_done.json"), {"seconds": seconds})
    return seconds


def _test(pre: Stage, ft: Stage, multitask: bool) -> dict:
    """Held-out test metrics of the task, cached as test_<task>.json in the evaluated stage's
    workdir (so deleting a stage to redo it drops its numbers too)."""
    from t5lite import evaluation
    path = _join(pre.workdir if multitask else ft.workdir, f"test_{ft.task}.json")
    cached = _read_json(path)
    if cached is not None:
        return cached
    ckpt = pre.workdir if multitask else _eval_checkpoint(ft)
    print(f"  test {ft.task} <- {ckpt}", flush=True)
    cfg, model, params = evaluation.load(ckpt, _eval_overrides(ft) if multitask else ())
    metrics = evaluation.evaluate(cfg, model, params, tasks=(ft.task,), split="test",
                                  max_examples=DOWNSTREAM[ft.task].test_examples)
    metrics = {k: float(v) for k, v in metrics.items()}
    _write_json(path, metrics)
    return metrics


def _check_tasks(tasks: Sequence[str]) -> None:
    for t in tasks:
        if t not in DOWNSTREAM:
            raise UserError(f"unknown downstream task {t!r}." + _did_you_mean(t, list(DOWNSTREAM))
                            + f" Known: {', '.join(DOWNSTREAM)}.")


def run(table: str | Table, workdir: str, rows: Sequence[str] = (), tasks: Sequence[str] = (),
        scale: str = "tiny", overrides: Sequence[str] = (), dry_run: bool = False) -> dict:
    """Run (or, dry_run, print) the table's rows; -> {row name: result}. See the module doc."""
    table = table if isinstance(table, Table) else load_table(table)
    if "://" not in workdir:
        workdir = os.path.abspath(workdir)
    selected = [table.row(r) for r in rows] if rows else list(table.rows)
    tasks = tuple(tasks) or table.tasks
    _check_tasks(tasks)
    results = {}
    for row in selected:
        pre, fts = plan_row(table, row, workdir, tasks, scale, overrides)
        row_dir = _join(workdir, table.name, row.name)
        title = f"# {table.name} / {row.name}: {' | '.join(row.label)}"
        if dry_run:
            print("\n".join([title, pre.command()]
                            + [ft.command() for ft in fts if not row.multitask]
                            + [eval_command(pre, ft, row.multitask) for ft in fts]), flush=True)
            continue
        print(title, flush=True)
        seconds = {"pretrain": _train(pre)}
        metrics = {}
        for ft in fts:
            if not row.multitask:
                seconds[f"finetune_{ft.task}"] = _train(ft)
            metrics.update(_test(pre, ft, row.multitask))
        old = _read_json(_join(row_dir, "result.json")) or {}
        results[row.name] = {
            "table": table.name, "row": row.name, "label": list(row.label),
            "baseline": row.name == table.baseline, "scale": scale,
            "metrics": {**old.get("metrics", {}), **metrics},
            "seconds": {**old.get("seconds", {}), **{k: v for k, v in seconds.items() if v}},
            "commands": [pre.command()] + [ft.command() for ft in fts if not row.multitask]}
        if results[row.name] != old:
            _write_json(_join(row_dir, "result.json"), results[row.name])
        _write_table(table, workdir)
    if results:
        print(render(table, workdir) + f"\n(written to {_join(workdir, table.name, 'table.md')})",
              flush=True)
    return results


# ----------------------------------------------------------------------------- render


def _metric_header(key: str) -> str:
    task, _, metric = key.partition("/")
    return f"{task} {metric}"


def render(table: Table, workdir: str) -> str:
    """Markdown: the table's rows that have a result.json x their downstream metrics."""
    found = [(r, _read_json(_join(workdir, table.name, r.name, "result.json")))
             for r in table.rows]
    done = [(r, res) for r, res in found if res]
    present = {k for _, res in done for k in res["metrics"]}
    keys = [k for d in DOWNSTREAM.values() for k in d.metrics if k in present]
    keys += sorted(k for k in present if k not in keys and k.split("/")[0] not in DOWNSTREAM)
    lines = [f"**{table.name}**: {table.caption}", "",
             "| " + " | ".join(list(table.label_columns) + [_metric_header(k) for k in keys])
             + " |", "|" + "---|" * (len(table.label_columns) + len(keys))]
    for r, res in done:
        label = list(r.label)
        label[0] = ("★ " if r.name == table.baseline else "") + label[0]
        cells = [f"{res['metrics'][k]:.2f}" if k in res["metrics"] else "–" for k in keys]
        lines.append("| " + " | ".join(label + cells) + " |")
    missing = [r.name for r, res in found if not res]
    scales = sorted({res.get("scale", "?") for _, res in done})
    lines += ["", f"Scale: {', '.join(scales) or '-'}; held-out test split; ★ = the paper's "
                  "baseline." + (f" Not run yet: {', '.join(missing)}." if missing else "")]
    return "\n".join(lines)


def _write_table(table: Table, workdir: str) -> str:
    import jax
    from etils import epath
    path = _join(workdir, table.name, "table.md")
    if jax.process_index() == 0:
        epath.Path(path).write_text(render(table, workdir) + "\n")
    return path
