"""Import / export Hugging Face T5, BERT, GPT-2, RoBERTa and ELECTRA checkpoints (local dirs only).

Supported HF classes: T5ForConditionalGeneration (v1.0: relu, tied and rescaled LM head; v1.1:
gated-gelu, untied), BertForPreTraining (MLM + NSP heads, pooler, token types; also
BertForMaskedLM, which many BERT checkpoints name while holding the NSP head too),
GPT2LMHeadModel, RobertaForMaskedLM (BERT layers without NSP / pooler; exported with
``model.hf_class="RobertaForMaskedLM"``. RoBERTa's <s> is id 0, t5lite's padding id: give
``encoder_segment_ids`` (as seqio's converters do; 0 = padding) and the encoder takes padding
from them, so <s> is a real token; without segment ids token 0 is padding) and
ElectraForPreTraining (the discriminator; a t5lite ELECTRA with a generator exports its
discriminator only). ``hf_to_t5lite`` maps the HF config.json onto a t5lite Config and every HF
tensor onto the t5lite parameter tree (layout: t5lite/models/architectures.py docstring), for
``scan_layers`` True (layers stacked on a leading axis) or False (``layers_0 ...``).
``t5lite_to_hf`` writes config.json + model.safetensors that ``from_pretrained`` loads, the
tokenizer files of the checkpoint's task (tokenizer_files: ``AutoTokenizer.from_pretrained``
then encodes text to the ids the model trained on) and the t5lite setup HF has no place for
(t5lite_setup: task, feature lengths, decoding), which ``import_hf`` restores.

One module per family holds its config mapping and its table of Rules (a t5lite path, an HF
tensor name and its HF shape, whether HF stores it transposed (torch Linear: [out, in]) and,
for GPT-2's fused c_attn, which third of it): t5, bert (+ RoBERTa, ELECTRA), gpt2. common holds
the Rule machinery, families picks the family, params applies the rules, hf_files reads and
writes HF dirs. Nothing here touches the network: only files in the given directory are read.
"""

from t5lite.convert import tokenizer_files
from t5lite.convert.common import Rule
from t5lite.convert.families import (SUPPORTED, config_from_hf, config_to_hf, family_of,
                                     hf_architecture)
from t5lite.convert.hf_files import read_hf_config, read_hf_dir
from t5lite.convert.params import hf_to_t5lite, import_hf, t5lite_to_hf

__all__ = ["Rule", "SUPPORTED", "config_from_hf", "config_to_hf", "family_of",
           "hf_architecture", "hf_to_t5lite", "import_hf", "read_hf_config", "read_hf_dir",
           "t5lite_to_hf", "tokenizer_files"]
