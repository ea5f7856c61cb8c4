"""Parameter-efficient finetuning: LoRA, prompt tuning, prefix tuning, adapters, (IA)^3,
layer freezing and gradual unfreezing (``cfg.model.peft``, a PeftConfig), applied from
outside the core model.

methods (which methods are on, their param names, config checks) -> modules (the model
modules: subclasses of the core layers that build_model passes in, see modules.py for the
param tree) -> masks (which params train) -> unfreeze (gradual unfreezing groups and the
optax wrapper that opens them) and files (PEFT-only params dirs, merge_lora). The optimizer
of a config wraps the masks and the unfreezing: train.optim.optimizer_for.
"""

from t5lite.peft.files import (
    load_peft, merge_lora, peft_subset, save_peft, save_with_checkpoint)
from t5lite.peft.masks import (
    count_trainable, describe, grad_mask, is_peft_param, needs_mask, path_str, trainable_mask)
from t5lite.peft.methods import (
    ADAPTER_SUFFIX, IA3_NAMES, LORA_NAMES, PEFT_MARKER, PREFIX_NAMES, PROMPT_NAME, check,
    enabled)
from t5lite.peft.modules import (
    MLP, Adapter, Attention, LoraDense, SoftPrompt, add_prefix, build_model, ia3_scale,
    lora_dense, prepend_prompt, prompt_param, prompted_stack, stack_modules)
from t5lite.peft.unfreeze import (
    Unfreeze, gradual_unfreeze, opened_groups, total_layers, unfreeze_groups)

__all__ = [
    "ADAPTER_SUFFIX", "Adapter", "Attention", "IA3_NAMES", "LORA_NAMES", "LoraDense", "MLP",
    "PEFT_MARKER", "PREFIX_NAMES", "PROMPT_NAME", "SoftPrompt", "add_prefix", "build_model",
    "check", "count_trainable", "describe", "enabled", "grad_mask", "ia3_scale", "is_peft_param",
    "Unfreeze", "gradual_unfreeze", "load_peft", "lora_dense", "merge_lora", "needs_mask",
    "opened_groups",
    "path_str", "peft_subset", "prepend_prompt", "prompt_param", "prompted_stack", "save_peft",
    "save_with_checkpoint", "stack_modules", "total_layers", "trainable_mask",
    "unfreeze_groups"]
