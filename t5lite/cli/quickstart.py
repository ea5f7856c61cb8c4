"""`t5lite quickstart`: the README's first command, end to end on the local data.

1. build the corpus, the sentiment set and the 8k SentencePiece vocabulary if missing;
2. pretrain configs/quickstart.py (tiny T5 v1.1, span corruption) into WORKDIR/pretrain;
3. finetune configs/quickstart_finetune.py from it on sentiment into WORKDIR/finetune,
   keeping the best params by validation accuracy in WORKDIR/finetune/best;
4. evaluate those on the held-out test split and print a summary.

Each stage resumes from its workdir, so an interrupted quickstart picks up where it stopped.
"""

from __future__ import annotations

import json
import os
import time

from etils import epath

from t5lite import config as config_lib
from t5lite.text_table import format_table

FAST_PRETRAIN = ["train.steps=16", "data.batch_size=16", "checkpoint.every_steps=16",
                 "train.eval_steps=1", "train.eval_every=0", "train.log_every=4"]
FAST_FINETUNE = ["train.steps=16", "checkpoint.every_steps=16", "eval.every_steps=8",
                 "eval.max_examples=64", "train.eval_steps=1", "train.log_every=4"]


def _first_last_loss(workdir: str) -> tuple[float, float]:
    losses = []
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("split") == "train" and "loss" in rec:
                losses.append(rec["loss"])
    return (losses[0], losses[-1]) if losses else (float("nan"), float("nan"))


def _majority_class(data_dir: str, split: str, limit: int = 0) -> tuple[str, float]:
    with open(os.path.join(data_dir, "finetune", "sentiment", f"{split}.tsv"),
              encoding="utf-8") as f:
        labels = [line.rstrip("\n").split("\t")[-1] for line in f if line.strip()]
    labels = labels[:limit] if limit else labels
    best = max(set(labels), key=labels.count)
    return best, 100.0 * labels.count(best) / len(labels)


def stage_configs(workdir: str, root: str, fast: bool, prepared: bool = True) -> list:
    """[(config, stage workdir)] of the pretrain and finetune stages."""
    common = [f"data.data_dir={root}"] + ([] if prepared else ["train.prepare_data=()"])
    pre_dir, ft_dir = os.path.join(workdir, "pretrain"), os.path.join(workdir, "finetune")
    return [
        (config_lib.load_config("quickstart", common + (FAST_PRETRAIN if fast else [])),
         pre_dir),
        (config_lib.load_config("quickstart_finetune", common + [
            f"checkpoint.init_from={pre_dir}"] + (FAST_FINETUNE if fast else [])), ft_dir)]


def check_workdir(workdir: str, root: str, fast: bool, prepared: bool = True) -> None:
    """Before anything runs: a quickstart workdir made with (without) --fast is rerun the same
    way. The trainer's own refusal would point at --allow-config-change / --set, which
    quickstart has not (and fast and full differ in data.batch_size: no flag continues one
    as the other)."""
    from t5lite.store import workdir as workdir_lib
    from t5lite.errors import UserError
    other = stage_configs(workdir, root, not fast, prepared)
    for (cfg, stage), (other_cfg, _) in zip(stage_configs(workdir, root, fast, prepared), other):
        try:
            workdir_lib.check_config(cfg, stage)
            continue
        except UserError as e:
            error = e
        try:
            workdir_lib.check_config(other_cfg, stage)
        except UserError:  # neither way (edited configs): it cannot be continued here
            try:
                old = json.loads((epath.Path(stage) / "config.json").read_text())
            except (OSError, ValueError):
                raise error from None  # unreadable: that message says what to do
            diff = workdir_lib.config_diff(old, json.loads(json.dumps(config_lib.to_dict(cfg))))
            raise UserError(f"{stage} was trained with another config "
                            f"({workdir_lib.format_diff(diff)}): give `t5lite quickstart` "
                            "another --workdir") from None
        made, again = ("without --fast", "") if fast else ("with --fast", " --fast")
        raise UserError(f"{workdir} holds a quickstart run made {made}: rerun `t5lite "
                        f"quickstart --workdir {workdir}{again}` to resume it, or give another "
                        "--workdir") from None


def run(workdir: str, fast: bool = False, data_dir: str = "", prepare: bool = True) -> dict:
    """Pretrain, finetune, evaluate; -> the summary numbers (also printed).
    prepare=False uses the data dir as it is (built elsewhere, or a test's small one)."""
    from t5lite import dataprep
    from t5lite.eval import evaluation
    from t5lite.train import trainer

    t0 = time.time()
    workdir = os.path.abspath(workdir)
    root = dataprep.data_dir(data_dir)
    check_workdir(workdir, root, fast, prepare)
    if prepare:
        root = dataprep.ensure_prepared(dataprep.QUICKSTART, root)
    (pre_cfg, pre_dir), (ft_cfg, ft_dir) = stage_configs(workdir, root, fast, prepare)

    print(f"[1/3] pretraining configs/quickstart.py -> {pre_dir}", flush=True)
    trainer.train(pre_cfg, pre_dir)
    t_pre = time.time() - t0

    print(f"[2/3] finetuning configs/quickstart_finetune.py on sentiment -> {ft_dir}",
          flush=True)
    trainer.train(ft_cfg, ft_dir)
    t_ft = time.time() - t0 - t_pre

    split, limit = "test", (64 if fast else 0)
    print(f"[3/3] evaluating {ft_dir}/best on the held-out {split} split", flush=True)
    cfg, model, params = evaluation.load(os.path.join(ft_dir, "best"))
    metrics = evaluation.evaluate(cfg, model, params, tasks=("sentiment",), split=split,
                                  max_examples=limit)
    first, last = _first_last_loss(pre_dir)
    label, majority = _majority_class(root, split, limit)
    summary = {"pretrain_loss_first": first, "pretrain_loss_last": last,
               "finetune_accuracy": metrics["sentiment/accuracy"],
               "majority_class_accuracy": majority, "pretrain_seconds": t_pre,
               "finetune_seconds": t_ft, "total_seconds": time.time() - t0}
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(format_table([
        ("quickstart", "result"),
        ("pretrain loss (span corruption)", f"{first:.2f} -> {last:.2f}"),
        (f"sentiment {split} accuracy", f"{summary['finetune_accuracy']:.1f}%"),
        (f"majority class ({label})", f"{majority:.1f}%"),
        ("time", f"{summary['total_seconds'] / 60:.1f} min (pretrain {t_pre / 60:.1f}, "
                 f"finetune {t_ft / 60:.1f})"),
        ("best finetuned params", os.path.join(ft_dir, "best"))], header=False))
    return summary
