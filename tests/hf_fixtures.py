"""Tiny Hugging Face models with random weights on disk, for the conversion tests.

Every parameter (LayerNorm scales and biases included) gets nonzero random values, so a
dropped bias, a missing transpose or a swapped norm shows up as a logit difference.
Configs are small but structurally realistic (several layers, several heads, padding).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import transformers
from torch import nn
from transformers.pytorch_utils import Conv1D

VOCAB = 99  # deliberately odd-sized
PARITY_TOL = 1e-4  # max abs logit difference allowed between float32 runs (t5lite or torch)


def t5_config(v1_1: bool):
    return transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        dropout_rate=0.0, layer_norm_epsilon=1e-6, decoder_start_token_id=0,
        feed_forward_proj="gated-gelu" if v1_1 else "relu", tie_word_embeddings=not v1_1)


def bert_config():
    return transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=24, type_vocab_size=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12)


def gpt2_config():
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=24, n_embd=32, n_layer=2, n_head=4, n_inner=48,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)


@torch.no_grad()
def randomize_(model: nn.Module, seed: int) -> None:
    """Nonzero random values everywhere, scaled so float32 logits stay O(1)."""
    g = torch.Generator().manual_seed(seed)

    def normal(p, std, mean=0.0):
        p.copy_(mean + std * torch.randn(p.shape, generator=g))

    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module.weight) in embeddings:
            if module.bias is not None:  # a tied output projection: only its bias is its own
                normal(module.bias, 0.1)
        elif isinstance(module, nn.Linear):
            normal(module.weight, 1.0 / math.sqrt(module.in_features))
            if module.bias is not None:
                normal(module.bias, 0.1)
        elif isinstance(module, Conv1D):  # GPT-2: weight is [in, out]
            normal(module.weight, 1.0 / math.sqrt(module.weight.shape[0]))
            normal(module.bias, 0.1)
        elif isinstance(module, nn.Embedding):
            normal(module.weight, 1.0)
        elif isinstance(module, nn.LayerNorm):
            normal(module.weight, 0.1, mean=1.0)
            normal(module.bias, 0.1)
        elif type(module).__name__ == "T5LayerNorm":
            normal(module.weight, 0.1, mean=1.0)
    for name, p in model.named_parameters():  # BERT's MLM output bias is a bare Parameter
        if name.endswith("predictions.bias"):
            normal(p, 0.1)


def make_hf_model(kind: str, seed: int = 0):
    """kind: t5_v1_0 | t5_v1_1 | bert | gpt2. Returns an eval-mode float32 model."""
    torch.manual_seed(seed)
    if kind == "t5_v1_0":
        model = transformers.T5ForConditionalGeneration(t5_config(v1_1=False))
    elif kind == "t5_v1_1":
        model = transformers.T5ForConditionalGeneration(t5_config(v1_1=True))
    elif kind == "bert":
        model = transformers.BertForPreTraining(bert_config())
    elif kind == "gpt2":
        model = transformers.GPT2LMHeadModel(gpt2_config())
    else:
        raise ValueError(kind)
    randomize_(model, seed)
    if kind == "t5_v1_1":  # v1.1 has its own output projection, untied from the embedding
        model.lm_head.weight = nn.Parameter(
            torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(
                seed + 1)) / math.sqrt(model.config.d_model))
    return model.eval()


def save_hf_model(model, path) -> str:
    """save_pretrained, float32 safetensors; returns the directory."""
    model.save_pretrained(str(path), safe_serialization=True)
    return str(path)


def load_hf_model(path):
    """Load back with transformers (eager attention, eval mode)."""
    model = transformers.AutoModelForPreTraining.from_pretrained(
        str(path), attn_implementation="eager")
    return model.eval()


# --------------------------------------------------------------------- padded batches


def padded_lengths(batch: int, length: int, rng) -> np.ndarray:
    """One full row, the others right-padded to random shorter lengths (>= 2)."""
    lens = rng.integers(2, length, size=batch)
    lens[0] = length
    return lens


def _mask(lens, length):
    return (np.arange(length)[None, :] < lens[:, None]).astype(np.int32)


def _tokens(rng, mask, low=2):
    return (rng.integers(low, VOCAB, size=mask.shape) * mask).astype(np.int32)


def _positions(mask):
    return np.broadcast_to(np.arange(mask.shape[1], dtype=np.int32), mask.shape).copy()


def t5_batches(rng, batch=3, enc_len=13, dec_len=9):
    """(HF kwargs, t5lite batch, decoder mask): decoder inputs are HF's shifted labels."""
    enc_mask = _mask(padded_lengths(batch, enc_len, rng), enc_len)
    dec_mask = _mask(padded_lengths(batch, dec_len, rng), dec_len)
    inputs = _tokens(rng, enc_mask)
    labels = _tokens(rng, dec_mask)
    shifted = np.zeros_like(labels)  # decoder_start_token_id = 0
    shifted[:, 1:] = labels[:, :-1]
    shifted *= dec_mask
    hf = dict(input_ids=torch.tensor(inputs, dtype=torch.long),
              attention_mask=torch.tensor(enc_mask, dtype=torch.long),
              decoder_input_ids=torch.tensor(shifted, dtype=torch.long),
              decoder_attention_mask=torch.tensor(dec_mask, dtype=torch.long))
    ours = dict(encoder_input_tokens=inputs, encoder_segment_ids=enc_mask,
                encoder_positions=_positions(enc_mask),
                decoder_input_tokens=shifted, decoder_target_tokens=labels,
                decoder_loss_weights=dec_mask, decoder_segment_ids=dec_mask,
                decoder_positions=_positions(dec_mask))
    return hf, ours, dec_mask


def bert_batches(rng, batch=3, length=11):
    mask = _mask(padded_lengths(batch, length, rng), length)
    tokens = _tokens(rng, mask)
    token_types = ((np.arange(length)[None, :] >= (mask.sum(1, keepdims=True) // 2))
                   * mask).astype(np.int32)  # second half of each row is sentence B
    hf = dict(input_ids=torch.tensor(tokens, dtype=torch.long),
              attention_mask=torch.tensor(mask, dtype=torch.long),
              token_type_ids=torch.tensor(token_types, dtype=torch.long))
    ours = dict(encoder_input_tokens=tokens, encoder_target_tokens=tokens,
                encoder_loss_weights=mask, encoder_segment_ids=mask,
                encoder_positions=_positions(mask), encoder_token_type_ids=token_types,
                nsp_labels=np.zeros((batch,), np.int32))
    return hf, ours, mask


def gpt2_batches(rng, batch=3, length=12):
    mask = _mask(padded_lengths(batch, length, rng), length)
    tokens = _tokens(rng, mask)
    hf = dict(input_ids=torch.tensor(tokens, dtype=torch.long),
              attention_mask=torch.tensor(mask, dtype=torch.long))
    ours = dict(decoder_input_tokens=tokens, decoder_target_tokens=tokens,
                decoder_loss_weights=mask, decoder_segment_ids=mask,
                decoder_positions=_positions(mask))
    return hf, ours, mask
