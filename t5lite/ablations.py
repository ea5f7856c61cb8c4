"""The T5 paper's ablation tables (Raffel et al. 2020) as data, a runner, and a renderer.

A Table (configs/ablations/tableN.py) names a pretraining config, the finetuning configs of
its downstream tasks (DOWNSTREAM) and rows; a Row is the paper's label plus config overrides
for the pretraining and/or finetuning stage, in `--set` syntax. `key:=expr` computes the value
from the stage's config as it stands at that point (``cfg``, ``L`` = inputs length, and the
helpers in _namespace), so a row such as "half the layers" or "targets long enough for 50%
corruption" holds at any scale.

Overrides of a stage apply in this order (later wins):
    base config file <- DOWNSTREAM task (finetuning) <- SCALES[scale] <- user `--set`
    (`pretrain.KEY=V` / `finetune.KEY=V`: one stage) <- seed <- table <- row (both stages,
    then this stage); then the scale's renames of the pretraining task (paper: C4) and, for a
    multi-task row, steps = pretraining + finetuning steps.
The user's overrides adjust the scale (model size, steps, lengths, data dir) under every row,
so a row's `:=` values follow them and the row's own change always holds.

`run` does, per row and seed: pretrain into WORKDIR/<table>/<row>[/seed<k>]/pretrain; finetune
on each task into .../finetune_<task> (from the pretrained params); evaluate on the scale's
report split (tiny / small: the best params by the task's validation metric on the held-out
test split; paper, and multi-task rows: every kept checkpoint on validation, the best per
task, as the paper); write .../result.json (runs, mean, std); re-render
WORKDIR/<table>/table.md (measured beside the paper's numbers). Every stage resumes from its
workdir and a finished one is skipped, so a rerun picks up where the last one stopped.
`dry_run` prints the equivalent `t5lite train` / `t5lite eval` commands instead; `estimate`
the steps, tokens and (with `t5lite compile`) TPU-hours.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import shlex
import time
from typing import Optional, Sequence

from t5lite import config as config_lib
from t5lite.config import python_files
from t5lite.monitor import flops as flops_lib
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
    pretrained: bool = True  # False: finetune from random params (the paper's Table 1 row)
    paper: Optional[tuple] = None  # the paper's numbers, one per PAPER_COLUMNS (None = unknown)


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
    paper_note: str = ""  # caveats about the paper's published numbers

    def __post_init__(self):
        names = [r.name for r in self.rows]
        if len(set(names)) != len(names):
            raise UserError(f"{self.name}: duplicate row names in {names}")
        if self.baseline and self.baseline not in names:
            raise UserError(f"{self.name}: baseline {self.baseline!r} is not a row")
        for r in self.rows:
            if r.paper is not None and len(r.paper) != len(PAPER_COLUMNS):
                raise UserError(f"{self.name}/{r.name}: paper numbers need one per column "
                                f"{PAPER_COLUMNS}")
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


# The paper's benchmarks, in its table order, and its Table 1 baseline (mean and standard
# deviation over 10 runs) and no-pretraining rows (arXiv 1910.10683). These and the tables'
# numbers in configs/ablations/ were checked row by row against the paper's text (ar5iv
# rendering); tests/test_paper_numbers.py pins them.
PAPER_COLUMNS = ("GLUE", "CNNDM", "SQuAD", "SGLUE", "EnDe", "EnFr", "EnRo")
PAPER_BASELINE = (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65)
PAPER_BASELINE_STD = (0.235, 0.065, 0.343, 0.416, 0.112, 0.090, 0.108)
PAPER_NO_PRETRAINING = (66.22, 17.60, 50.31, 53.04, 25.86, 39.77, 24.04)


@dataclasses.dataclass(frozen=True)
class Downstream:
    """How to finetune and evaluate on one task (the paper: GLUE, CNN/DM, WMT, ...)."""

    config: str  # finetuning config file (keeps the best params by `eval.best_metric`)
    overrides: tuple  # task-specific overrides of that config
    metrics: tuple  # metrics shown in the table (the paper: one per benchmark)
    test_examples: int = 0  # held-out examples decoded for the result (0 = the whole split)
    # a benchmark made of several tasks (GLUE, SuperGLUE): finetune on the mixture named by the
    # overrides, evaluate each member and report "<key>/average" (mean over tasks of the mean
    # of each task's metrics, as the paper's average)
    members: tuple = ()
    column: str = ""  # the paper's column this task stands for ("" = none)
    eval_task: str = ""  # the seqio task evaluated ("" = the DOWNSTREAM key)


def _paper_task(mixture: str, metric: str, lengths: dict, column: str, members=(),
                max_length: int = 0) -> Downstream:
    return Downstream("quickstart_finetune", (
        f"data.mixture_or_task={mixture}", f"data.feature_lengths={lengths!r}",
        "train.prepare_data=()", "eval.best_metric=", "data.pack=True",
        f"decode.max_length={max_length or lengths['targets']}"), (metric,), 0, tuple(members),
        column, "" if members else mixture)


DOWNSTREAM = {
    "sentiment": Downstream("quickstart_finetune", (), ("sentiment/accuracy",), column="GLUE"),
    "translate_en_de": Downstream("finetune_translate_en_de", (), ("translate_en_de/bleu",),
                                  500, column="EnDe"),
    "summarize_debian": Downstream("quickstart_finetune", (
        "data.mixture_or_task=summarize_debian",
        "data.feature_lengths={'inputs': 128, 'targets': 32}", "data.pack=True",
        "train.prepare_data=('summarize_debian', 'vocab_sp8k')",
        "optim.learning_rate=1e-3", "eval.best_metric=summarize_debian/rouge2",
        "eval.max_examples=200", "decode.max_length=32"), ("summarize_debian/rouge2",), 500,
        column="CNNDM"),
    # 51 Debian sections from package descriptions (47k train, 5,861 test: a binomial standard
    # error of ~0.6 points where sentiment's 351 test sentences give ~2.5); --scale small's task.
    # A linear decay to zero over the run: the constant rate stopped every run mid-climb, where
    # the seeds spread most (bench/RESULTS.md, sessions 13-14)
    "topic_debian": Downstream("quickstart_finetune", (
        "data.mixture_or_task=topic_debian", "train.prepare_data=('topic_debian', 'vocab_sp8k')",
        "data.feature_lengths.targets=8", "decode.max_length=8", "optim.learning_rate=5e-3",
        "optim.schedule=linear",
        "eval.best_metric=topic_debian/accuracy", "eval.max_examples=1000"),
        ("topic_debian/accuracy",), column="GLUE"),
    # --scale paper: the paper's benchmarks (t5lite/tasks/formats.py, TFDS data dir), the t5
    # vocabulary; finetuning lengths come from SCALES["paper"] (512 / 512, packed)
    "glue": _paper_task("paper_glue", "glue/average", {"inputs": 512, "targets": 512}, "GLUE",
                        members=(), max_length=16),
    "cnn_dailymail": _paper_task("paper_cnn_dailymail", "paper_cnn_dailymail/rouge2",
                                 {"inputs": 512, "targets": 512}, "CNNDM", max_length=256),
    "squad": _paper_task("paper_squad", "paper_squad/f1", {"inputs": 512, "targets": 512},
                         "SQuAD", max_length=64),
    "super_glue": _paper_task("paper_super_glue", "super_glue/average",
                              {"inputs": 512, "targets": 512}, "SGLUE", max_length=64),
    "wmt_ende": _paper_task("paper_wmt_ende", "paper_wmt_ende/bleu",
                            {"inputs": 512, "targets": 512}, "EnDe", max_length=256),
    "wmt_enfr": _paper_task("paper_wmt_enfr", "paper_wmt_enfr/bleu",
                            {"inputs": 512, "targets": 512}, "EnFr", max_length=256),
    "wmt_enro": _paper_task("paper_wmt_enro", "paper_wmt_enro/bleu",
                            {"inputs": 512, "targets": 512}, "EnRo", max_length=256),
}
PAPER_TASKS = ("glue", "cnn_dailymail", "squad", "super_glue", "wmt_ende", "wmt_enfr",
               "wmt_enro")


def _fill_members():
    from t5lite.tasks import formats
    DOWNSTREAM["glue"] = dataclasses.replace(DOWNSTREAM["glue"], members=tuple(
        formats.PAPER_GLUE))
    DOWNSTREAM["super_glue"] = dataclasses.replace(DOWNSTREAM["super_glue"], members=tuple(
        formats.PAPER_SUPERGLUE))


@dataclasses.dataclass(frozen=True)
class Scale:
    pretrain: tuple = ()
    finetune: tuple = ()
    tasks: tuple = ()  # default downstream tasks at this scale (() = the table's)
    # renames of the pretraining task / mixture: (prefix, replacement), e.g. the local corpus
    # tasks -> the C4 ones
    renames: tuple = ()
    report_split: str = "test"  # split of the reported numbers (the paper: validation)
    # choose the best checkpoint per task by evaluating every kept checkpoint (the paper);
    # False: the finetuning run's best params by eval.best_metric
    per_task_checkpoints: bool = False


_T5_BASE = ("model.d_model=768", "model.num_heads=12", "model.head_dim=64", "model.d_ff=3072",
            "model.num_encoder_layers=12", "model.num_decoder_layers=12", "model.ffn=relu",
            "model.tie_embeddings=True", "model.scale_tied_logits=True",
            "model.dropout_rate=0.1", "model.dtype=bfloat16", "data.batch_size=128",
            "model.vocab_size=32128")
PAPER_PRETRAIN_STEPS = 2 ** 19  # 2^35 tokens: 524,288 steps x 128 x 512
PAPER_FINETUNE_STEPS = 2 ** 18
SCALES = {
    # CPU: tiny T5 v1.1 (2+2 layers, d_model 128, 8k vocabulary), 128-token inputs. Sized
    # for minutes per row (sentiment only) on 2 idle cores, from the quickstart's measured step
    # time (bench/RESULTS.md); the finetuning steps are cheaper (64 + 4 tokens).
    # Too few steps to separate the rows (most land near the majority class): a smoke test.
    "tiny": Scale(
        pretrain=("train.steps=150", "checkpoint.every_steps=50", "train.eval_every=0"),
        finetune=("train.steps=150", "eval.every_steps=50", "checkpoint.every_steps=50")),
    # CPU study: the same tiny model on 64-token inputs (half the pretraining cost per step),
    # 1200 pretraining steps (2.5M tokens; 400 did not help the finetuned model), and the
    # quickstart's finetuning length (600 steps), keeping the best of 4 checkpoints on
    # validation; reports the test split. Downstream: topic_debian, whose 5,861 test examples
    # measure to ~0.6 points and which this little pretraining helps (sentiment, which it does
    # not help, stays available: --tasks sentiment). Aimed at Table 2's key rows (pretrained
    # baseline vs no pretraining, denoising vs LM) on 2 idle cores (bench/RESULTS.md has what
    # was measured).
    "small": Scale(
        pretrain=("train.steps=1200", "checkpoint.every_steps=200", "train.eval_every=0",
                  "data.feature_lengths.inputs=64", "optim.warmup_steps=100"),
        finetune=("train.steps=600", "eval.every_steps=150", "checkpoint.every_steps=150"),
        tasks=("topic_debian",)),
    # The paper's setting (Section 3.1): T5 base (v1.0: 12+12 layers, d_model 768, ReLU, tied
    # head), the t5 32k SentencePiece vocabulary, C4 (TFDS c4/en), batch 128, 512 input tokens,
    # 2^19 steps of pretraining (inverse square root LR, 10^4 warmup) and 2^18 of finetuning
    # (constant LR 1e-3) on 128 packed length-512 sequences, checkpoints every 5,000 steps and
    # the best one per task on the validation split, which is what the paper reports.
    "paper": Scale(
        pretrain=_T5_BASE + (f"train.steps={PAPER_PRETRAIN_STEPS}", "optim.warmup_steps=10000",
                             "train.prepare_data=()",
                             "data.feature_lengths={'inputs': 512, 'targets': 114}",
                             "checkpoint.every_steps=5000", "train.eval_every=5000"),
        finetune=_T5_BASE + (f"train.steps={PAPER_FINETUNE_STEPS}", "optim.learning_rate=1e-3",
                             "data.feature_lengths={'inputs': 512, 'targets': 512}",
                             "data.pack=True", "eval.every_steps=0", "eval.max_examples=0",
                             "checkpoint.every_steps=5000", "checkpoint.keep=1000"),
        tasks=PAPER_TASKS, renames=(("corpus_", "c4_"), ("multitask_", "paper_multitask_")),
        report_split="validation", per_task_checkpoints=True),
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
    from t5lite.tasks.objectives import iid_targets_length
    return iid_targets_length(inputs_length, density)


def drop_targets(inputs_length: int, density: float) -> int:
    """Targets length for "drop corrupted tokens" on the i.i.d. rows' inputs_length - 1 token
    chunks (the dropped tokens + EOS), 25% headroom."""
    return _round_up(1.25 * ((inputs_length - 1) * density + 1))


def span_targets(inputs_length: int, density: float, mean_span: float) -> int:
    """Exact targets length for span corruption (seqio's random_spans_helper)."""
    from t5lite.tasks.objectives import random_spans_helper
    return random_spans_helper(inputs_length, density, mean_span)[1]


def num_layers(cfg) -> int:
    """Layer groups opened one by one under gradual unfreezing (cfg: a full Config)."""
    from t5lite.models.peft import total_layers
    return total_layers(cfg.model)


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
    module = python_files.load(path, "t5lite_ablation_" + os.path.basename(path)[:-3])
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


def _scale(scale: str) -> Scale:
    if scale not in SCALES:
        raise UserError(f"unknown scale {scale!r}; one of {', '.join(SCALES)}.")
    return SCALES[scale]


def row_dir(workdir: str, table: Table, row: Row, seed: int = 0) -> str:
    """WORKDIR/<table>/<row> for seed 0 (as before --seeds), .../<row>/seed<k> for the rest."""
    d = _join(workdir, table.name, row.name)
    return d if seed == 0 else _join(d, f"seed{seed}")


def _seed_overrides(seed: int) -> list:
    return [f"train.seed={seed}", f"data.seed={seed}"] if seed else []


def plan_row(table: Table, row: Row, workdir: str, tasks: Sequence[str], scale: str = "tiny",
             overrides: Sequence[str] = (), seed: int = 0
             ) -> tuple[Optional[Stage], list[Stage]]:
    """-> (pretraining stage or None, one finetuning stage per task). A multi-task row trains
    no finetuning stage (its stages only give the test decoding settings); a row with
    pretrained=False has no pretraining stage. ``seed`` > 0 sets train.seed and data.seed."""
    sc, user = _scale(scale), split_user_overrides(list(overrides))
    seeds = _seed_overrides(seed)
    rdir = row_dir(workdir, table, row, seed)
    pre_dir = _join(rdir, "pretrain")
    stages = []
    for task in tasks:
        d = DOWNSTREAM[task]
        init = [f"checkpoint.init_from={pre_dir}"] if row.pretrained else []
        layers = (list(d.overrides) + list(sc.finetune) + user["finetune"] + seeds
                  + list(table.finetune) + list(row.both) + list(row.finetune) + init)
        plain, cfg = resolve(d.config, layers)
        stages.append(Stage("finetune", d.config, _join(rdir, f"finetune_{task}"), plain, cfg,
                            task))
    if not row.pretrained:
        return None, stages
    layers = (list(sc.pretrain) + user["pretrain"] + seeds + list(table.pretrain)
              + list(row.both) + list(row.pretrain))
    plain, cfg = resolve(table.pretrain_config, layers)
    extra = []
    for old, new in sc.renames:  # e.g. the local corpus tasks -> C4 at paper scale
        if cfg.data.mixture_or_task.startswith(old):
            extra.append(f"data.mixture_or_task={new}{cfg.data.mixture_or_task[len(old):]}")
    if row.multitask:
        # the paper: as many steps as pretraining plus finetuning (2^19 + 2^18), and every
        # checkpoint kept so that each task gets its best one
        ft_steps = max([ft.cfg.train.steps for ft in stages] or [0])
        extra += [f"train.steps={cfg.train.steps + ft_steps}", "checkpoint.keep=100000"]
    if extra:
        plain, cfg = resolve(table.pretrain_config, layers + extra)
    return Stage("pretrain", table.pretrain_config, pre_dir, plain, cfg), stages


def _per_checkpoint(scale: str, row: Row) -> bool:
    """Pick each task's best checkpoint by evaluating every kept one (multi-task rows always,
    as the paper; finetuning at paper scale)."""
    return row.multitask or _scale(scale).per_task_checkpoints


def _eval_checkpoint(stage: Stage) -> str:
    return _join(stage.workdir, "best") if stage.cfg.eval.best_metric else stage.workdir


def _eval_overrides(ft: Stage) -> list[str]:
    """Evaluating multi-task params on a task: decode as that task's finetuning would."""
    return [f"decode.max_length={ft.cfg.decode.max_length}",
            f"eval.batch_size={ft.cfg.eval.batch_size}"]


def _eval_tasks(task: str) -> tuple:
    _fill_members()
    d = DOWNSTREAM[task]
    return d.members or (d.eval_task or task,)


def eval_command_line(pre: Optional[Stage], ft: Stage, multitask: bool, scale: str = "tiny",
                      per_checkpoint: bool = False) -> str:
    """The `t5lite eval` line(s) (text, for --dry-run) that report a finetuning stage."""
    split = _scale(scale).report_split
    n = DOWNSTREAM[ft.task].test_examples if split == "test" else 0
    sets = _eval_overrides(ft) if multitask else []
    tail = ([f"--max-examples {n}"] if n else []) + [f"--set {shlex.quote(o)}" for o in sets]
    lines = []
    for task in _eval_tasks(ft.task):
        if per_checkpoint:
            src = pre.workdir if multitask else ft.workdir
            ckpt = _join(src, "checkpoints", "STEP")
            lines.append(" ".join([f"t5lite eval --checkpoint {shlex.quote(ckpt)} --task "
                                   f"{task} --split {split}"] + tail)
                         + "  # for every STEP; the best per task is reported")
        else:
            ckpt = pre.workdir if multitask else _eval_checkpoint(ft)
            lines.append(" ".join([f"t5lite eval --checkpoint {shlex.quote(ckpt)} --task "
                                   f"{task} --split {split}"] + tail))
    return "\n".join(lines)


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
    from t5lite.store import workdir as workdir_lib
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
    from t5lite.train import trainer
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


def _checkpoint_steps(workdir: str) -> list[int]:
    from etils import epath
    d = epath.Path(workdir, "checkpoints")
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


def _average(task: str, metrics: dict) -> dict:
    """A benchmark of several tasks: add "<task>/average" = mean over member tasks of the mean
    of each member's metrics (the paper's GLUE / SuperGLUE average)."""
    d = DOWNSTREAM[task]
    if not d.members:
        return metrics
    per_task = [sum(v) / len(v) for v in ([x for k, x in metrics.items()
                                           if k.startswith(m + "/")
                                           and not k.endswith("/checkpoint_step")]
                                          for m in d.members) if v]
    return {**metrics, d.metrics[0]: sum(per_task) / len(per_task)} if per_task else metrics


def _selection_metric(task: str, metrics: dict) -> float:
    """The number a member task's best checkpoint is chosen by: the mean of its metrics."""
    vals = [v for k, v in metrics.items() if k.startswith(task + "/")]
    return sum(vals) / len(vals) if vals else float("-inf")


def _test(pre: Optional[Stage], ft: Stage, multitask: bool, scale: str = "tiny",
          per_checkpoint: bool = False) -> dict:
    """The task's reported metrics (the scale's report split), cached as <split>_<task>.json
    in the evaluated stage's workdir (so deleting a stage to redo it drops its numbers too).

    per_checkpoint: every kept checkpoint of the evaluated stage is evaluated on validation
    (eval.max_examples of the task's finetuning config; the whole split at paper scale) and
    each (member) task reports its best one (the paper's selection); else the finetuning run's
    best params (or the multi-task run's final ones)."""
    from t5lite.eval import evaluation
    split = _scale(scale).report_split
    src = pre.workdir if multitask else ft.workdir
    path = _join(src, f"{split}_{ft.task}.json")
    cached = _read_json(path)
    if cached is not None:
        return cached
    n = DOWNSTREAM[ft.task].test_examples if split == "test" else 0
    sets = _eval_overrides(ft) if multitask else ()
    metrics = {}
    for task in _eval_tasks(ft.task):
        if per_checkpoint:
            best, best_step = None, None
            for step in _checkpoint_steps(src):
                ckpt = _join(src, "checkpoints", str(step))
                print(f"  validate {task} <- {ckpt}", flush=True)
                cfg, model, params = evaluation.load(ckpt, sets)
                m = evaluation.evaluate(cfg, model, params, tasks=(task,), split="validation",
                                        max_examples=ft.cfg.eval.max_examples)
                if best is None or _selection_metric(task, m) > _selection_metric(task, best):
                    best, best_step = m, step
            if best is None:
                raise UserError(f"{src} has no checkpoints to choose from.")
            if split != "validation":
                cfg, model, params = evaluation.load(_join(src, "checkpoints", str(best_step)),
                                                     sets)
                best = evaluation.evaluate(cfg, model, params, tasks=(task,), split=split,
                                           max_examples=n)
            metrics.update({k: float(v) for k, v in best.items()})
            metrics[f"{task}/checkpoint_step"] = float(best_step)
        else:
            ckpt = pre.workdir if multitask else _eval_checkpoint(ft)
            print(f"  {split} {task} <- {ckpt}", flush=True)
            cfg, model, params = evaluation.load(ckpt, sets)
            m = evaluation.evaluate(cfg, model, params, tasks=(task,), split=split,
                                    max_examples=n)
            metrics.update({k: float(v) for k, v in m.items()})
    metrics = _average(ft.task, metrics)
    _write_json(path, metrics)
    return metrics


def _check_tasks(tasks: Sequence[str]) -> None:
    for t in tasks:
        if t not in DOWNSTREAM:
            raise UserError(f"unknown downstream task {t!r}." + _did_you_mean(t, list(DOWNSTREAM))
                            + f" Known: {', '.join(DOWNSTREAM)}.")


def _summarize(runs: dict) -> tuple[dict, dict]:
    """{seed: metrics} -> (mean, sample standard deviation; 0 for one run) per metric."""
    keys = sorted({k for m in runs.values() for k in m})
    mean, std = {}, {}
    for k in keys:
        vals = [m[k] for m in runs.values() if k in m]
        mean[k] = sum(vals) / len(vals)
        std[k] = (math.sqrt(sum((v - mean[k]) ** 2 for v in vals) / (len(vals) - 1))
                  if len(vals) > 1 else 0.0)
    return mean, std


def run(table: str | Table, workdir: str, rows: Sequence[str] = (), tasks: Sequence[str] = (),
        scale: str = "tiny", overrides: Sequence[str] = (), dry_run: bool = False,
        seeds: int = 1) -> dict:
    """Run (or, dry_run, print) the table's rows, each ``seeds`` times (train.seed and
    data.seed 0 .. seeds - 1); -> {row name: result}. See the module doc."""
    table = table if isinstance(table, Table) else load_table(table)
    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}.")
    from t5lite.store import checkpointing
    workdir = checkpointing.abspath(workdir)
    selected = [table.row(r) for r in rows] if rows else list(table.rows)
    tasks = tuple(tasks) or _scale(scale).tasks or table.tasks
    _check_tasks(tasks)
    results = {}
    from t5lite.monitor import progress  # rows done / to do (a bar, or plain lines in a log file)
    for row in progress.bar(selected, desc=f"ablate {table.name}", unit="row",
                            disable=dry_run):
        per_ckpt = _per_checkpoint(scale, row)
        print(f"# {table.name} / {row.name}: {' | '.join(row.label)}", flush=True)
        runs, seconds, commands = {}, {}, []
        for seed in range(seeds):
            pre, fts = plan_row(table, row, workdir, tasks, scale, overrides, seed)
            stages = ([pre] if pre else []) + ([] if row.multitask else fts)
            commands += [st.command() for st in stages]
            if dry_run:
                print("\n".join([st.command() for st in stages]
                                + [eval_command_line(pre, ft, row.multitask, scale, per_ckpt)
                                   for ft in fts]), flush=True)
                continue
            for st in stages:
                key = "pretrain" if st.kind == "pretrain" else f"finetune_{st.task}"
                t = _train(st)
                if t:
                    seconds[f"{key}@{seed}" if seed else key] = t
            metrics = {}
            for ft in fts:
                metrics.update(_test(pre, ft, row.multitask, scale, per_ckpt))
            runs[str(seed)] = metrics
        if dry_run:
            continue
        rdir = row_dir(workdir, table, row)
        old = _read_json(_join(rdir, "result.json")) or {}
        old_runs = old.get("runs") or ({"0": old["metrics"]} if old.get("metrics") else {})
        all_runs = {**old_runs, **runs}
        mean, std = _summarize(all_runs)
        results[row.name] = {
            "table": table.name, "row": row.name, "label": list(row.label),
            "baseline": row.name == table.baseline, "scale": scale,
            "split": _scale(scale).report_split,
            "metrics": mean, "std": std, "runs": all_runs,
            "seconds": {**old.get("seconds", {}), **seconds},
            "commands": commands}
        if results[row.name] != old:
            _write_json(_join(rdir, "result.json"), results[row.name])
        _write_table(table, workdir)
    if results:
        print(render(table, workdir) + f"\n(written to {_join(workdir, table.name, 'table.md')})",
              flush=True)
    return results


# ----------------------------------------------------------------------------- estimate


def _compile_json(stage: Stage, topology: str, cache: dict) -> dict:
    """`t5lite compile --json` (the TPU issue's AOT compile) for one stage, cached by config."""
    import subprocess
    import sys
    key = (stage.config, tuple(stage.overrides))
    if key not in cache:
        cfg = stage.config if stage.config.endswith(".py") else os.path.join(
            config_lib.configs_dir(), f"{stage.config}.py")
        cmd = [sys.executable, "-m", "t5lite.cli", "compile", "--config", cfg, "--topology",
               topology, "--json"] + [a for o in stage.overrides for a in ("--set", o)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            err = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            if "invalid choice: 'compile'" in proc.stderr:
                raise UserError("--topology needs `t5lite compile` (AOT compile for TPU), which "
                                "this install lacks; --estimate without --topology prints the "
                                "steps and tokens.")
            raise UserError(f"t5lite compile failed for {stage.workdir}: {err}")
        cache[key] = json.loads(proc.stdout.strip().splitlines()[-1])
    return cache[key]


def estimate(table: str | Table, rows: Sequence[str] = (), tasks: Sequence[str] = (),
             scale: str = "paper", overrides: Sequence[str] = (), seeds: int = 1,
             topology: str = "") -> dict:
    """Steps and tokens of every training stage of the rows (x seeds), and with ``topology``
    the estimated TPU-hours from `t5lite compile` (chips x est_step_seconds x steps); prints a
    table; -> {"rows": {row: {...}}, "total": {...}}. Evaluation is not counted."""
    table = table if isinstance(table, Table) else load_table(table)
    selected = [table.row(r) for r in rows] if rows else list(table.rows)
    tasks = tuple(tasks) or _scale(scale).tasks or table.tasks
    _check_tasks(tasks)
    cache, out = {}, {}
    for row in selected:
        pre, fts = plan_row(table, row, "/estimate", tasks, scale, overrides)
        stages = ([pre] if pre else []) + ([] if row.multitask else fts)
        steps = sum(st.cfg.train.steps for st in stages) * seeds
        tokens = sum(st.cfg.train.steps * flops_lib.tokens_per_step(st.cfg)
                     for st in stages) * seeds
        entry = {"steps": steps, "tokens": tokens}
        if topology:
            hours = 0.0
            for st in stages:
                c = _compile_json(st, topology, cache)
                if not c.get("fits", True):
                    raise UserError(f"{table.name}/{row.name} {st.kind} does not fit "
                                    f"{topology} ({c.get('bytes_per_chip', {}).get('total')} "
                                    f"bytes per chip); try a larger topology or --set "
                                    "mesh / remat settings.")
                hours += st.cfg.train.steps * float(c["est_step_seconds"]) * int(c["chips"])
            entry["tpu_hours"] = hours * seeds / 3600
        out[row.name] = entry
    total = {k: sum(e[k] for e in out.values()) for k in ("steps", "tokens")}
    if topology:
        total["tpu_hours"] = sum(e["tpu_hours"] for e in out.values())
    head = ["row", "train steps", "tokens"] + (["TPU-hours"] if topology else [])
    lines = [" | ".join(head)]
    for name, e in list(out.items()) + [("total", total)]:
        lines.append(" | ".join([name, f"{e['steps']:,}", f"{e['tokens']:.3g}"]
                                + ([_hours(e["tpu_hours"])] if topology else [])))
    print(f"{table.name} at --scale {scale}" + (f" on {topology}" if topology else "")
          + f", {seeds} seed(s); training only (the per-checkpoint evaluations come on top):\n"
          + "\n".join(lines), flush=True)
    return {"rows": out, "total": total}


def _hours(h: float) -> str:
    return f"{h:,.1f}" if h >= 10 else f"{h:.3g}"  # tiny rows: seconds, not "0.0"


# ----------------------------------------------------------------------------- render


def _metric_header(key: str) -> str:
    task, _, metric = key.partition("/")
    return f"{task} {metric}"


def _bold_set(values: dict, std: float) -> set:
    """Rows within two standard deviations of the best (the paper's rule); std 0 or unknown:
    the best value(s) only."""
    if not values:
        return set()
    best = max(values.values())
    return {r for r, v in values.items() if v >= best - 2 * std - 1e-12}


def _fmt(x: float, bold: bool, spread: Optional[float] = None) -> str:
    cell = f"{x:.2f}" + (f" ± {spread:.2f}" if spread is not None else "")
    return f"**{cell}**" if bold else cell


def render(table: Table, workdir: str) -> str:
    """Markdown: each row's measured metrics (mean ± std over seeds where several ran) beside
    the paper's published numbers; ★ the paper's baseline; bold = within two standard
    deviations of the column's best (measured: the baseline's spread over seeds, else the
    rows' mean spread; paper: its Table 1 baseline spread)."""
    found = [(r, _read_json(_join(row_dir(workdir, table, r), "result.json")))
             for r in table.rows]
    done = {r.name: res for r, res in found if res}
    present = {k for res in done.values() for k in res["metrics"]
               if not k.endswith("/checkpoint_step")}
    keys = [k for d in DOWNSTREAM.values() for k in d.metrics if k in present]
    keys += sorted(k for k in present if k not in keys and k.split("/")[0] not in DOWNSTREAM
                   and not any(k.startswith(m + "/") for d in DOWNSTREAM.values()
                               for m in d.members))
    n_seeds = max([len(res.get("runs", {})) or 1 for res in done.values()] or [1])
    paper_rows = [r for r in table.rows if r.paper is not None]
    header = list(table.label_columns) + [_metric_header(k) for k in keys]
    if paper_rows:
        header += [f"{c} (paper)" for c in PAPER_COLUMNS]
    lines = [f"**{table.name}**: {table.caption}", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    bold = {}
    for k in keys:
        vals = {n: res["metrics"][k] for n, res in done.items() if k in res["metrics"]}
        stds = {n: res.get("std", {}).get(k, 0.0) for n, res in done.items()
                if len(res.get("runs", {})) > 1}
        spread = stds.get(table.baseline) if table.baseline in stds else (
            sum(stds.values()) / len(stds) if stds else 0.0)
        bold[k] = _bold_set(vals, spread)
    for i, c in enumerate(PAPER_COLUMNS):
        vals = {r.name: r.paper[i] for r in paper_rows if r.paper[i] is not None}
        bold[c] = _bold_set(vals, PAPER_BASELINE_STD[i])
    for r in table.rows:
        res = done.get(r.name)
        if res is None and r.paper is None:
            continue
        label = list(r.label)
        label[0] = ("★ " if r.name == table.baseline else "") + label[0]
        cells = []
        for k in keys:
            if res is None or k not in res["metrics"]:
                cells.append("–")
                continue
            several = len(res.get("runs", {})) > 1
            cells.append(_fmt(res["metrics"][k], r.name in bold[k],
                              res.get("std", {}).get(k, 0.0) if several else None))
        if paper_rows:
            cells += ["–" if r.paper is None or r.paper[i] is None
                      else _fmt(r.paper[i], r.name in bold[c])
                      for i, c in enumerate(PAPER_COLUMNS)]
        lines.append("| " + " | ".join(label + cells) + " |")
    missing = [r.name for r, res in found if not res]
    scales = sorted({res.get("scale", "?") for res in done.values()})
    splits = sorted({res.get("split", "test") for res in done.values()})
    notes = [f"Scale: {', '.join(scales) or '-'}; measured on the {', '.join(splits) or '-'} "
             f"split" + (f", mean ± std over {n_seeds} seeds" if n_seeds > 1 else ", one seed")
             + "; ★ = the paper's baseline; bold = within two standard deviations of the "
             "column's best (the paper's rule)."]
    if paper_rows:
        notes.append("Paper: arXiv 1910.10683v4, its validation-set numbers (GLUE and SuperGLUE "
                     "averages, CNN/DM ROUGE-2-F, SQuAD, WMT BLEU); bold by its Table 1 "
                     "baseline spread."
                     + (f" {table.paper_note}" if table.paper_note else ""))
    if missing:
        notes.append(f"Not run yet: {', '.join(missing)}.")
    lines += [""] + notes
    return "\n".join(lines)


def _write_table(table: Table, workdir: str) -> str:
    import jax
    from etils import epath
    path = _join(workdir, table.name, "table.md")
    if jax.process_index() == 0:
        epath.Path(path).write_text(render(table, workdir) + "\n")
        from t5lite.monitor import plot  # the same numbers as a chart: table.png
        results = [(r, _read_json(_join(workdir, table.name, r.name, "result.json")) or {})
                   for r in table.rows]
        plot.ablation_chart(f"{table.name}: {table.caption}", [
            (" ".join(r.label), res.get("metrics", {}), r.name == table.baseline)
            for r, res in results], _join(workdir, table.name, "table.png"))
    return path
