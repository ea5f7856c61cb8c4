"""The T5 paper's ablation tables (Raffel et al. 2020) as data, a runner, and a renderer.

A Table (configs/ablations/tableN.py) names a pretraining config, the finetuning configs of
its downstream tasks (DOWNSTREAM) and rows; a Row is the paper's label plus config overrides
for the pretraining and/or finetuning stage, in `--set` syntax. `key:=expr` computes the value
from the stage's config as it stands at that point (``cfg``, ``L`` = inputs length, and the
length helpers of overrides.py), so a row such as "half the layers" or "targets long enough
for 50% corruption" holds at any scale.

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
the steps, tokens and (with a TPU topology, by an AOT compile) TPU-hours.

Modules, each importing only those above it: paper (the paper's numbers, DOWNSTREAM, SCALES),
tables (Table, Row, the table files), overrides (`:=` values, resolve, scaled sizes),
modifications (Narang et al. 2021's Table 1 as data), files (the study's paths and JSON
files), plan (a row's stages), pretrain_columns (a pretraining run's measured columns),
rendering (table.md), runner (run), estimation (estimate).
"""

from t5lite.ablations.estimation import estimate
from t5lite.ablations.files import row_dir
from t5lite.ablations.overrides import (drop_targets, iid_targets, num_layers, resolve,
                                        scaled, span_targets, split_user_overrides)
from t5lite.ablations.paper import (BASELINE_PRETRAIN, DOWNSTREAM, PAPER_BASELINE,
                                    PAPER_BASELINE_STD, PAPER_COLUMNS, PAPER_FINETUNE_STEPS,
                                    PAPER_NO_PRETRAINING, PAPER_PRETRAIN_STEPS, PAPER_TASKS,
                                    SCALES, Downstream, Scale)
from t5lite.ablations.plan import Stage, eval_command_line, plan_row
from t5lite.ablations.rendering import render
from t5lite.ablations.runner import run
from t5lite.ablations.tables import Row, Table, list_tables, load_table, table_names, tables_dir

__all__ = [
    "BASELINE_PRETRAIN", "DOWNSTREAM", "PAPER_BASELINE", "PAPER_BASELINE_STD", "PAPER_COLUMNS",
    "PAPER_FINETUNE_STEPS", "PAPER_NO_PRETRAINING", "PAPER_PRETRAIN_STEPS", "PAPER_TASKS",
    "SCALES", "Downstream", "Row", "Scale", "Stage", "Table", "drop_targets", "estimate",
    "eval_command_line", "iid_targets", "list_tables", "load_table", "num_layers", "plan_row",
    "render", "resolve", "row_dir", "run", "scaled", "span_targets", "split_user_overrides",
    "table_names", "tables_dir"]
