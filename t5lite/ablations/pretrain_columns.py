"""The pretraining columns of a table that reports them (Narang et al. 2021: parameters, steps
per second, the loss early in pretraining and at its end), measured from the pretraining
run's own metrics.jsonl, so they sit beside the paper's in the rendered table."""

from __future__ import annotations

import statistics

from t5lite.ablations.plan import Stage

# the paper's early loss: at 65,536 of 524,288 steps
EARLY_FRACTION = 65536 / 524288
# the measured columns, in the paper's order
KEYS = ("pretrain/params_M", "pretrain/steps_per_s", "pretrain/early_loss",
        "pretrain/final_loss")
# cost, not quality: never bold (as the paper's Params / Ops / Step/s), since more parameters
# is no better and a step rate on a shared host measures its load as much as the model
PLAIN_KEYS = ("pretrain/params_M", "pretrain/steps_per_s")


def pretraining_metrics(pre: Stage) -> dict:
    """{"pretrain/params_M", "pretrain/early_loss", "pretrain/final_loss",
    "pretrain/steps_per_s"} of a trained pretraining stage: the training loss logged nearest
    EARLY_FRACTION of its steps and at its last logged step (the paper: held-out loss), the
    median logged steps per second after the first interval (which holds the compile)."""
    from t5lite import models
    from t5lite.monitor.plot import read_metrics
    out = {"pretrain/params_M": models.count_params(pre.cfg.model) / 1e6}
    train = [r for r in read_metrics(pre.workdir).get("train", []) if "loss" in r]
    if train:
        early = pre.cfg.train.steps * EARLY_FRACTION
        out["pretrain/early_loss"] = float(
            min(train, key=lambda r: abs(r["step"] - early))["loss"])
        out["pretrain/final_loss"] = float(train[-1]["loss"])
        rates = [r["steps_per_s"] for r in train[1:] if "steps_per_s" in r]
        if rates:
            out["pretrain/steps_per_s"] = float(statistics.median(rates))
    return out
