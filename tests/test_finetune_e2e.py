"""Pretrain -> finetune -> evaluate, end to end through `t5lite quickstart`.

The fast test runs the real configs (quickstart.py, quickstart_finetune.py) for a few steps on
the small synthetic data dir: it checks the pipeline (checkpoints, init_from, periodic seqio
evaluation, best params, held-out evaluation), not the accuracy. The slow test is the README's
run on the real local data and asserts accuracy above the majority class.
"""

import json
import math
import os

import pytest

import tasks_testdata
from t5lite.cli import quickstart
from t5lite.errors import UserError
from t5lite.eval import evaluation


def test_quickstart_fast_pipeline(tmp_path, capsys):
    root = str(tmp_path / "data")
    restore = tasks_testdata.use_data_dir(root)
    try:
        summary = quickstart.run(str(tmp_path / "qs"), fast=True, data_dir=root, prepare=False)
        history = {run: (tmp_path / "qs" / run / "metrics.jsonl").read_bytes()
                   for run in ("pretrain", "finetune")}
        # a rerun trains nothing: its summary keeps the first run's cost (and its numbers), and
        # its re-evaluation of the same params adds no second copy of a metrics line
        again = quickstart.run(str(tmp_path / "qs"), fast=True, data_dir=root, prepare=False)
        assert again == summary
        for run, before in history.items():
            assert (tmp_path / "qs" / run / "metrics.jsonl").read_bytes() == before, run
        with pytest.raises(UserError, match=r"made with --fast: rerun `t5lite quickstart "
                           r"--workdir .* --fast` to resume it"):  # (refused before training)
            quickstart.run(str(tmp_path / "qs"), data_dir=root, prepare=False)
    finally:
        restore()
    out = capsys.readouterr().out
    assert "sentiment test accuracy" in out and "majority class" in out
    for key in ("pretrain_loss_first", "pretrain_loss_last", "finetune_accuracy",
                "majority_class_accuracy", "total_seconds"):
        assert math.isfinite(summary[key]), key
    assert summary["pretrain_loss_last"] < summary["pretrain_loss_first"]
    assert 0.0 <= summary["finetune_accuracy"] <= 100.0
    ft = tmp_path / "qs" / "finetune"
    with open(ft / "config.json") as f:  # finetuning started from the pretrained run
        assert json.load(f)["checkpoint"]["init_from"] == str(tmp_path / "qs" / "pretrain")
    evals = [r for r in map(json.loads, open(ft / "metrics.jsonl"))
             if r["split"] == "eval_tasks"]
    assert [r["step"] for r in evals] == [8, 16]
    with open(ft / "best" / "metrics.json") as f:
        best = json.load(f)
    assert best["sentiment/accuracy"] == max(r["sentiment/accuracy"] for r in evals)
    with open(tmp_path / "qs" / "summary.json") as f:
        assert json.load(f) == pytest.approx(summary)
    with open(tmp_path / "qs" / "pretrain" / "goodput.json") as f:  # the cost of training it
        assert summary["pretrain_seconds"] == json.load(f)["summary"]["wall_s"]
    assert summary["total_seconds"] > summary["pretrain_seconds"] + summary["finetune_seconds"]


@pytest.mark.slow
def test_quickstart_real_data_beats_majority_class(tmp_path):
    """The README run: ~minutes on 2 CPU cores; needs `t5lite data prepare quickstart`."""
    from t5lite import dataprep
    if not all(dataprep.is_prepared(n) for n in dataprep.QUICKSTART):
        pytest.skip("local data not prepared: run `t5lite data prepare quickstart`")
    summary = quickstart.run(str(tmp_path / "qs"))
    assert summary["pretrain_loss_last"] < summary["pretrain_loss_first"] - 1.0
    assert summary["finetune_accuracy"] > summary["majority_class_accuracy"] + 5.0
    cfg, _, _ = evaluation.load(os.path.join(tmp_path, "qs", "finetune", "best"))
    assert cfg.eval.best_metric == "sentiment/accuracy"
