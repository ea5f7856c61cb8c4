"""Which module mixes tokens in a Block's self-attention sub-layer (``model.attention_type``):
dot-product attention (the Stack's attention class, PEFT's when it adapts it), a Synthesizer
(models/synthesizer.py) or a lightweight / dynamic convolution (models/local_conv.py)."""

from __future__ import annotations

import functools

from t5lite.models.local_conv import LocalConvolution
from t5lite.models.synthesizer import SYNTHESIZERS, SynthesizerAttention

CONVOLUTIONS = ("lightweight_conv", "dynamic_conv")
ATTENTION_TYPES = ("multihead",) + SYNTHESIZERS + CONVOLUTIONS


def self_attention(cfg, default: type, causal: bool):
    """The self-attention sub-layer's class, called as cls(cfg, name=...)(x, x, bias, ...);
    ``causal``: a decoder's (its convolution window ends at the query)."""
    if cfg.attention_type in SYNTHESIZERS:
        return SynthesizerAttention
    if cfg.attention_type in CONVOLUTIONS:
        return functools.partial(LocalConvolution, causal=causal)
    return default
