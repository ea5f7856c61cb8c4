"""Which family an HF config or a t5lite model belongs to, and the config mapping both ways
(each family's own mapping lives in its module: t5, bert (+ RoBERTa, ELECTRA), gpt2)."""

from __future__ import annotations

from typing import Optional

from t5lite import config as config_lib
from t5lite.convert import bert, gpt2, t5
from t5lite.convert.common import Family
from t5lite.errors import UserError

SUPPORTED = {
    "T5ForConditionalGeneration": "t5",
    "BertForPreTraining": "bert",
    "BertForMaskedLM": "bert",  # heads present in the file decide (pooler / NSP optional)
    "GPT2LMHeadModel": "gpt2",
    "RobertaForMaskedLM": "roberta",  # the BERT rules on renamed tensors
    "ElectraForPreTraining": "electra",  # the discriminator (BERT layers + RTD head)
}
_BY_MODEL_TYPE = {"t5": "T5ForConditionalGeneration", "bert": "BertForPreTraining",
                  "gpt2": "GPT2LMHeadModel", "roberta": "RobertaForMaskedLM",
                  "electra": "ElectraForPreTraining"}
FAMILIES: dict[str, Family] = {family.name: family for family in (
    t5.FAMILY, bert.BERT, bert.ROBERTA, bert.ELECTRA, gpt2.FAMILY)}
_ROBERTA_CLASS = "RobertaForMaskedLM"


def hf_architecture(hf_cfg: dict) -> str:
    archs = hf_cfg.get("architectures") or []
    if not archs and hf_cfg.get("model_type") in _BY_MODEL_TYPE:
        archs = [_BY_MODEL_TYPE[hf_cfg["model_type"]]]
    for a in archs:
        if a in SUPPORTED:
            return a
    raise UserError(f"unsupported architecture {archs or hf_cfg.get('model_type')}: t5lite "
                    f"converts {', '.join(SUPPORTED)}. Load the model in transformers as one "
                    "of these classes and save_pretrained it, or train it in t5lite.")


def config_from_hf(hf_cfg: dict, tensors: Optional[dict] = None,
                   scan_layers: bool = True) -> config_lib.Config:
    """A t5lite Config whose ModelConfig reproduces the HF model (``tensors`` decides T5
    tying: a T5 lm_head that differs from the embedding means untied)."""
    family = SUPPORTED[hf_architecture(hf_cfg)]
    cfg = config_lib.Config(name=f"hf_{family}")
    cfg.model.scan_layers = scan_layers
    FAMILIES[family].fill_config(cfg, hf_cfg, tensors)
    config_lib.validate(cfg)
    return cfg


def family_of(m) -> str:
    """Which HF family a t5lite ModelConfig exports to (UserError if none fits)."""
    name = {"encoder_decoder": "t5", "encoder_only": "bert", "decoder_only": "gpt2"}.get(
        m.architecture)
    if name is None:
        raise UserError(f"architecture {m.architecture!r} has no Hugging Face counterpart here; "
                        "export supports encoder_decoder (T5), encoder_only (BERT) and "
                        "decoder_only (GPT-2).")
    if m.hf_class == _ROBERTA_CLASS:
        name = "roberta"
    if name == "bert" and m.electra.rtd_head:
        name = "electra"
    family = FAMILIES[name]
    bad = [f"{k}={getattr(m, k)!r} (needs {v!r})" for k, v in family.export_needs.items()
           if getattr(m, k) != v]
    bad += family.export_problems(m)
    if m.hf_class not in ("", _ROBERTA_CLASS):
        bad.append(f"hf_class={m.hf_class!r} (needs '' or '{_ROBERTA_CLASS}')")
    if m.ffn not in family.ffn_out:
        bad.append(f"ffn={m.ffn!r} (needs one of {', '.join(family.ffn_out)})")
    if _peft_on(m):
        bad.append("PEFT parameters present (LoRA: merge it first with `t5lite convert "
                   "merge-lora SRC MERGED`; prompts, prefixes, adapters and (IA)^3 have no Hugging "
                   "Face counterpart)")
    if bad:
        raise UserError(f"this model cannot be exported as {name}: " + "; ".join(bad) + ".")
    return name


def _peft_on(m) -> bool:
    p = m.peft
    return bool(p.lora_rank or p.prompt_tokens or p.prefix_tokens or p.adapter_dim or p.ia3)


def config_to_hf(m) -> dict:
    """The HF config.json for a t5lite ModelConfig."""
    return FAMILIES[family_of(m)].config_to_hf(m)
