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


def _goodput_summary(stage_dir: str) -> dict:
    try:
        with open(os.path.join(stage_dir, "goodput.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _costs(workdir: str, stages: list, t0: float, t1: float) -> dict:
    """-> {"pretrain_seconds", "finetune_seconds", "total_seconds"}. stages: [(stage dir,
    seconds this run spent training it, whether it trained)]; t0, t1: when this run started
    and when it started pretraining. A stage's cost is the wall time of every run that
    trained it (its goodput.json, start-up included: an interrupted and resumed stage counts
    both runs); the total adds this run's time outside the stages (data preparation, the test
    evaluation) that no stage counted. A rerun that trains nothing keeps summary.json's
    costs: what the quickstart cost when it ran."""
    records = [_goodput_summary(d) for d, _, _ in stages]
    pre, ft = (float(r.get("summary", {}).get("wall_s", measured))
               for r, (_, measured, _) in zip(records, stages))
    other = time.time() - t0 - sum(measured for _, measured, _ in stages)
    if stages[0][2] and records[0].get("runs"):  # pretraining's start-up began before t1
        other -= max(0.0, t1 - max(records[0]["runs"][-1]["started"], t0))
    costs = {"pretrain_seconds": pre, "finetune_seconds": ft,
             "total_seconds": pre + ft + max(0.0, other)}
    if any(trained for _, _, trained in stages):
        return costs
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            before = json.load(f)
        return {k: float(before[k]) for k in costs}
    except (OSError, ValueError, KeyError, TypeError):
        return costs


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
    t1 = time.time()
    pre_trained = "goodput" in trainer.train(pre_cfg, pre_dir)  # (a finished run: no goodput)
    t_pre = time.time() - t1

    print(f"[2/3] finetuning configs/quickstart_finetune.py on sentiment -> {ft_dir}",
          flush=True)
    ft_trained = "goodput" in trainer.train(ft_cfg, ft_dir)
    t_ft = time.time() - t1 - t_pre

    split, limit = "test", (64 if fast else 0)
    print(f"[3/3] evaluating {ft_dir}/best on the held-out {split} split", flush=True)
    cfg, model, params = evaluation.load(os.path.join(ft_dir, "best"))
    metrics = evaluation.evaluate(cfg, model, params, tasks=("sentiment",), split=split,
                                  max_examples=limit)
    first, last = _first_last_loss(pre_dir)
    label, majority = _majority_class(root, split, limit)
    summary = {"pretrain_loss_first": first, "pretrain_loss_last": last,
               "finetune_accuracy": metrics["sentiment/accuracy"],
               "majority_class_accuracy": majority}
    summary.update(_costs(workdir, [(pre_dir, t_pre, pre_trained), (ft_dir, t_ft, ft_trained)],
                          t0, t1))
    t_pre, t_ft = summary["pretrain_seconds"], summary["finetune_seconds"]
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
