"""A row's training stages (pretraining, one finetuning per downstream task) with their
resolved configs and workdirs, and the `t5lite train` / `t5lite eval` lines that redo them."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Optional, Sequence

from t5lite import config as config_lib
from t5lite.ablations.files import join_path, row_dir
from t5lite.ablations.overrides import resolve, split_user_overrides
from t5lite.ablations.paper import DOWNSTREAM, SCALES, Scale
from t5lite.ablations.tables import Row, Table, did_you_mean
from t5lite.errors import UserError


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


def get_scale(scale: str) -> Scale:
    if scale not in SCALES:
        raise UserError(f"unknown scale {scale!r}; one of {', '.join(SCALES)}.")
    return SCALES[scale]


def check_tasks(tasks: Sequence[str]) -> None:
    """UserError for a name that is no DOWNSTREAM task."""
    for t in tasks:
        if t not in DOWNSTREAM:
            raise UserError(f"unknown downstream task {t!r}." + did_you_mean(t, list(DOWNSTREAM))
                            + f" Known: {', '.join(DOWNSTREAM)}.")


def _seed_overrides(seed: int) -> list:
    return [f"train.seed={seed}", f"data.seed={seed}"] if seed else []


def plan_row(table: Table, row: Row, workdir: str, tasks: Sequence[str], scale: str = "tiny",
             overrides: Sequence[str] = (), seed: int = 0
             ) -> tuple[Optional[Stage], list[Stage]]:
    """-> (pretraining stage or None, one finetuning stage per task). A multi-task row trains
    no finetuning stage (its stages only give the test decoding settings); a row with
    pretrained=False has no pretraining stage. ``seed`` > 0 sets train.seed and data.seed."""
    settings, user = get_scale(scale), split_user_overrides(list(overrides))
    seeds = _seed_overrides(seed)
    row_path = row_dir(workdir, table, row, seed)
    pre_dir = join_path(row_path, "pretrain")
    stages = []
    for task in tasks:
        downstream = DOWNSTREAM[task]
        init = [f"checkpoint.init_from={pre_dir}"] if row.pretrained else []
        layers = (list(downstream.overrides) + list(settings.finetune) + user["finetune"]
                  + seeds + list(table.finetune) + list(row.both) + list(row.finetune) + init)
        plain, cfg = resolve(downstream.config, layers)
        stages.append(Stage("finetune", downstream.config, join_path(row_path, f"finetune_{task}"),
                            plain, cfg, task))
    if not row.pretrained:
        return None, stages
    layers = (list(settings.pretrain) + user["pretrain"] + seeds + list(table.pretrain)
              + list(row.both) + list(row.pretrain))
    plain, cfg = resolve(table.pretrain_config, layers)
    extra = []
    for old, new in settings.renames:  # e.g. the local corpus tasks -> C4 at paper scale
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


def per_checkpoint_selection(scale: str, row: Row) -> bool:
    """Pick each task's best checkpoint by evaluating every kept one (multi-task rows always,
    as the paper; finetuning at paper scale)."""
    return row.multitask or get_scale(scale).per_task_checkpoints


def eval_checkpoint(stage: Stage) -> str:
    """The params a finetuning stage reports: its best ones when it keeps them, else its last."""
    return join_path(stage.workdir, "best") if stage.cfg.eval.best_metric else stage.workdir


def eval_overrides(ft: Stage) -> list[str]:
    """Evaluating multi-task params on a task: decode as that task's finetuning would."""
    return [f"decode.max_length={ft.cfg.decode.max_length}",
            f"eval.batch_size={ft.cfg.eval.batch_size}"]


def eval_tasks(task: str) -> tuple:
    """The seqio tasks evaluated for a DOWNSTREAM task (a benchmark's members)."""
    downstream = DOWNSTREAM[task]
    return downstream.members or (downstream.eval_task or task,)


def eval_command_line(pre: Optional[Stage], ft: Stage, multitask: bool, scale: str = "tiny",
                      per_checkpoint: bool = False) -> str:
    """The `t5lite eval` line(s) (text, for --dry-run) that report a finetuning stage."""
    split = get_scale(scale).report_split
    n = DOWNSTREAM[ft.task].test_examples if split == "test" else 0
    sets = eval_overrides(ft) if multitask else []
    tail = ([f"--max-examples {n}"] if n else []) + [f"--set {shlex.quote(o)}" for o in sets]
    lines = []
    for task in eval_tasks(ft.task):
        if per_checkpoint:
            src = pre.workdir if multitask else ft.workdir
            ckpt = join_path(src, "checkpoints", "STEP")
            lines.append(" ".join([f"t5lite eval --checkpoint {shlex.quote(ckpt)} --task "
                                   f"{task} --split {split}"] + tail)
                         + "  # for every STEP; the best per task is reported")
        else:
            ckpt = pre.workdir if multitask else eval_checkpoint(ft)
            lines.append(" ".join([f"t5lite eval --checkpoint {shlex.quote(ckpt)} --task "
                                   f"{task} --split {split}"] + tail))
    return "\n".join(lines)
