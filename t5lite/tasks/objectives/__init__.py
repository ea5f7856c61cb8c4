"""Pretraining objectives as seqio preprocessors, one module per family.

Every objective is a dataset -> dataset function with seqio's keyword conventions
(``output_features``, ``sequence_length``), so any Task can compose it:

  t5        the T5 paper's objectives (span corruption, i.i.d., BERT-style, MASS-style, drop
            tokens, deshuffling, prefix LM, LM) as one ``denoise`` with different pieces
  bert      BERT's masked LM (80/10/10) and next sentence prediction rows
  bart      BART's noising functions and ``bart_denoising``
  spanbert  SpanBERT's whole-word span masking (``span_mlm``)
  common    chunking, token budgets, special ids, word starts

The names are re-exported here: ``from t5lite.tasks import objectives; objectives.span_mlm``.
"""

from t5lite.tasks.objectives.common import (  # noqa: F401
    map_over_dataset, feature_vocabulary, concat_and_split, split_documents, limit_tokens,
    bert_special_ids, random_token_range, word_starts)
from t5lite.tasks.objectives.t5 import (  # noqa: F401
    random_spans_helper, random_spans_noise_mask, iid_noise_mask, NOISE_MASKS,
    noise_span_to_unique_sentinel, nonnoise_span_to_unique_sentinel, drop_noise_tokens,
    drop_nonnoise_tokens, noise_token_to_sentinel, noise_token_to_random_token_or_sentinel,
    original_tokens, TOKEN_FNS, denoise, span_corruption, iid_denoising, drop_tokens,
    bert_style_denoising, mass_style_denoising, deshuffling, prefix_lm, iid_targets_length,
    iid_denoising_lm, inputs_then_targets, full_lm)
from t5lite.tasks.objectives.bert import (  # noqa: F401
    bert_mlm, bert_pairs, bert_single)
from t5lite.tasks.objectives.bart import (  # noqa: F401
    bart_mask_id, infilling_plan, text_infilling, token_masking, token_deletion,
    document_rotation, sentence_final_ids, sentence_permutation, BART_NOISES, bart_denoising)
from t5lite.tasks.objectives.spanbert import (  # noqa: F401
    span_length_probs, span_mlm)
