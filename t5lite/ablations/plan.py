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
    source: Optional["Stage"] = None  # leave-one-out: the finetuning's own pretraining stage
    start: int = 0  # the step training starts at (a continued pretraining run's last step)

    def command(self) -> str:
        cfg = self.config if self.config.endswith(".py") else f"configs/{self.config}.py"
        return " ".join(["t5lite train", "--config", cfg, "--workdir", shlex.quote(self.workdir)]
                        + [f"--set {shlex.quote(o)}" for o in self.overrides])


def get_scale(scale: str) -> Scale:
    if scale not in SCALES:
        raise UserError(f"unknown scale {scale!r}; one of {', '.join(SCALES)}.")
    return SCALES[scale]


def default_tasks(table: Table, scale: str) -> tuple:
    """The tasks a study finetunes on when --tasks names none: the table's own at this scale,
    else the scale's, else the table's."""
    return table.default_tasks(scale) or get_scale(scale).tasks or table.tasks


def check_tasks(tasks: Sequence[str]) -> None:
    """UserError for a name that is no DOWNSTREAM task."""
    for t in tasks:
        if t not in DOWNSTREAM:
            raise UserError(f"unknown downstream task {t!r}." + did_you_mean(t, list(DOWNSTREAM))
                            + f" Known: {', '.join(DOWNSTREAM)}.")


def check_splits(tasks: Sequence[str], scale: str) -> None:
    """UserError, before anything trains, for a downstream task whose evaluated tasks lack the
    split the scale reports or the validation split its checkpoints are chosen on (TFDS's
    SQuAD has no test split)."""
    import seqio
    import t5lite.tasks  # noqa: F401  (registers the built-in tasks)
    report = get_scale(scale).report_split
    for task in tasks:
        for name in eval_tasks(task):
            have = list(seqio.get_mixture_or_task(name).splits)
            for split in dict.fromkeys((report, "validation")):
                if split not in have:
                    raise UserError(
                        f"--tasks {task}: {name} has no {split} split (only {', '.join(have)}),"
                        f" which --scale {scale} needs; pick a scale that reports validation "
                        "(--scale paper) or another task.")


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
        init = ([f"checkpoint.init_from={pre_dir}"]
                if row.pretrained and not downstream.from_scratch else [])
        layers = (list(downstream.overrides) + list(settings.finetune) + user["finetune"]
                  + seeds + list(table.finetune) + list(table.scale_layers(scale, "finetune"))
                  + list(downstream.final) + list(row.both) + list(row.finetune) + init)
        plain, cfg = resolve(downstream.config, layers)
        stages.append(Stage("finetune", downstream.config, join_path(row_path, f"finetune_{task}"),
                            plain, cfg, task))
    if not row.pretrained:
        return None, stages
    layers = (list(settings.pretrain) + user["pretrain"] + seeds + list(table.pretrain)
              + list(table.scale_layers(scale, "pretrain")) + list(row.both) + list(row.pretrain))
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
        # one mixture has one length per feature: none shorter than a task's own finetuning
        # (the paper's CNN/DM and WMT targets: 512, not the denoising task's)
        extra.append(_mixture_lengths(cfg, stages))
    if extra:
        plain, cfg = resolve(table.pretrain_config, layers + extra)
    return _finish(table, row, settings, layers + extra,
                   Stage("pretrain", table.pretrain_config, pre_dir, plain, cfg), stages)


def _finish(table: Table, row: Row, settings: Scale, layers: list, pre: Stage,
            stages: list) -> tuple[Optional[Stage], list[Stage]]:
    """A pretraining row's last steps: a finetuned row whose pretraining mixes in the
    downstream tasks gets their lengths; leave-one-out pretrains per task; the scale may
    continue the pretraining run into each finetuning (T5's finetune)."""
    if not row.multitask and pre.cfg.data.mixture_or_task.startswith(_MULTITASK_PREFIXES):
        layers = layers + [_mixture_lengths(pre.cfg, stages)]
        plain, cfg = resolve(table.pretrain_config, layers)
        pre = dataclasses.replace(pre, overrides=plain, cfg=cfg)
    if row.leave_one_out:
        stages = [_leave_one_out(table, layers, pre, ft) for ft in stages]
    if settings.continue_pretraining and not row.multitask:
        stages = [ft if DOWNSTREAM[ft.task].from_scratch
                  else _continue_pretraining(ft, ft.source or pre) for ft in stages]
    return (None if row.leave_one_out else pre), stages


_MULTITASK_PREFIXES = ("multitask_", "paper_multitask_")


def _mixture_lengths(cfg, stages: list) -> str:
    """One mixture has one length per feature: none shorter than a task's own finetuning."""
    return "data.feature_lengths=" + repr({
        k: max([n] + [ft.cfg.data.feature_lengths.get(k, 0) for ft in stages])
        for k, n in cfg.data.feature_lengths.items()})


def _with(stage: Stage, extra: list) -> Stage:
    """The stage with more overrides (resolved again from its plain ones)."""
    plain, cfg = resolve(stage.config, stage.overrides + extra)
    return dataclasses.replace(stage, overrides=plain, cfg=cfg)


def _leave_one_out(table: Table, layers: list, pre: Stage, ft: Stage) -> Stage:
    """The paper's leave-one-out: pretrain on the mixture without ft's task, finetune on it."""
    workdir = join_path(pre.workdir.rsplit("/", 1)[0], f"pretrain_without_{ft.task}")
    mixture = f"{pre.cfg.data.mixture_or_task}_without_{ft.task}"
    plain, cfg = resolve(table.pretrain_config, layers + [f"data.mixture_or_task={mixture}"])
    source = Stage("pretrain", table.pretrain_config, workdir, plain, cfg, ft.task)
    return dataclasses.replace(_with(ft, [f"checkpoint.init_from={workdir}"]), source=source)


def _continue_pretraining(ft: Stage, pre: Stage) -> Stage:
    """Finetuning from the pretraining run's step count and optimizer state, for its own
    train.steps more (train.steps then counts both)."""
    return dataclasses.replace(_with(ft, [
        "checkpoint.init_state=True", f"train.steps={pre.cfg.train.steps + ft.cfg.train.steps}"]),
        start=pre.cfg.train.steps)


def training_stages(pre: Optional[Stage], fts: list, row: Row) -> list[Stage]:
    """The stages a row trains, in order: its pretraining, then per task that task's own
    pretraining (leave-one-out) and its finetuning (none for a multi-task row)."""
    out = [pre] if pre else []
    for ft in fts:
        out += ([ft.source] if ft.source else []) + ([] if row.multitask else [ft])
    return out


def row_training_stages(table: Table, row: Row, workdir: str, tasks: Sequence[str],
                        scale: str = "tiny", overrides: Sequence[str] = (), seed: int = 0
                        ) -> list[Stage]:
    """Every stage a row trains for one seed, in order (an ensemble's members included)."""
    if not row.ensemble:
        pre, fts = plan_row(table, row, workdir, tasks, scale, overrides, seed)
        return training_stages(pre, fts, row)
    shared, members = plan_members(table, row, workdir, tasks, scale, overrides, seed)
    return ([shared] if shared else []) + [st for pre, fts in members
                                           for st in training_stages(pre, fts, row)]


def plan_members(table: Table, row: Row, workdir: str, tasks: Sequence[str],
                 scale: str = "tiny", overrides: Sequence[str] = (), seed: int = 0
                 ) -> tuple[Optional[Stage], list[tuple[Optional[Stage], list[Stage]]]]:
    """An ensemble row: (the pretraining its members share, or None; per member (its own
    pretraining or None, its finetunings)), members in WORKDIR/<table>/<row>[/seed<k>]/
    member<m>. Member m of seed k trains with seed k * members + m (member 0 of seed 0 is the
    baseline's run); with shared_pretraining all finetune from the row's one pretraining."""
    shared = (plan_row(table, row, workdir, tasks, scale, overrides, seed)[0]
              if row.shared_pretraining else None)
    members = []
    for m in range(row.ensemble):
        s = seed * row.ensemble + m
        member = dataclasses.replace(
            row, name=f"{row.name}{f'/seed{seed}' if seed else ''}/member{m}", ensemble=0)
        seeds = [f"finetune.train.seed={s}", f"finetune.data.seed={s}"] + (
            [] if shared else [f"pretrain.train.seed={s}", f"pretrain.data.seed={s}"])
        pre, fts = plan_row(table, member, workdir, tasks, scale, list(overrides) + seeds)
        if shared:
            pre, fts = None, [_with(ft, [f"checkpoint.init_from={shared.workdir}"])
                              for ft in fts]
        members.append((pre, fts))
    return shared, members


def per_checkpoint_selection(scale: str, row: Row) -> bool:
    """Pick each task's best checkpoint by evaluating every kept one (multi-task rows always,
    as the paper; finetuning at paper scale)."""
    return row.multitask or get_scale(scale).per_task_checkpoints


def eval_checkpoint(stage: Stage) -> str:
    """The params a finetuning stage reports: its best ones when it keeps them, else its last."""
    return join_path(stage.workdir, "best") if stage.cfg.eval.best_metric else stage.workdir


def eval_overrides(ft: Stage) -> list[str]:
    """Evaluating multi-task params on a task: decode as that task's finetuning would."""
    return [f"decode.max_length={config_lib.decode_length(ft.cfg)}",
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
