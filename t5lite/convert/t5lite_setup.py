"""What a Hugging Face config.json cannot hold: the t5lite setup of a finetuned model (its task,
feature lengths, vocabulary, decoding, the model fields HF has no key for). Export writes the
whole t5lite Config beside the HF files as t5lite_config.json (transformers ignores it); import
restores it when it still describes the dir's config.json, and otherwise says which of the
defaults it fills in stand where the model's own setup would be.
"""

from __future__ import annotations

import dataclasses
import json
import os

from t5lite import config as config_lib
from t5lite.errors import UserError

FILE = "t5lite_config.json"
# the fields a Hugging Face model's own task decides, named when the import has to guess them
_GUESSED = ("data.mixture_or_task", "data.feature_lengths")


def write(cfg, m, out_dir: str) -> None:
    """``cfg`` (a full Config) with ``m``, the model config that was exported, as FILE."""
    if not hasattr(cfg, "data"):
        return
    saved = config_lib.to_dict(dataclasses.replace(cfg, model=m))
    with open(os.path.join(out_dir, FILE), "w", encoding="utf-8") as f:
        json.dump(saved, f, indent=2, sort_keys=True)


def restore(hf_dir: str, cfg, same_model) -> tuple:
    """-> (the Config to import with, one line on where its non-model fields come from).
    ``cfg``: the Config mapped from config.json and the weights; ``same_model(saved model
    config)``: whether the saved model is still the one config.json and the weights describe
    (an HF config edited after the export, or other weights, are not)."""
    path = os.path.join(hf_dir, FILE)
    guessed = ", ".join(f"{k}={config_lib.get_by_path(cfg, k)!r}" for k in _GUESSED)
    defaults = (f"config.json holds no t5lite setup, so the import has t5lite's defaults "
                f"({guessed}); give the model's task with --set data.mixture_or_task=TASK "
                "(or eval.vocabulary) when you evaluate, infer or export it")
    if not os.path.isfile(path):
        return cfg, defaults
    try:
        with open(path, encoding="utf-8") as f:
            saved = config_lib.from_dict(json.load(f))
        saved.model.scan_layers = cfg.model.scan_layers
        saved = config_lib.validate(saved)
    except (UserError, ValueError, TypeError, AttributeError, KeyError) as e:
        first = (str(e).splitlines() or [""])[0][:160]
        return cfg, (f"{FILE} is not a t5lite config this version accepts ({type(e).__name__}: "
                     f"{first}), so its setup was not used; {defaults}")
    if not same_model(saved.model):
        return cfg, (f"{FILE} describes another model than config.json and the weights "
                     f"(edited after the export?), so its setup was not used; {defaults}")
    task, lengths = saved.data.mixture_or_task, dict(saved.data.feature_lengths)
    return saved, (f"kept the t5lite setup exported with it ({FILE}: {saved.name}, task "
                   f"{task}, feature lengths {lengths})")
