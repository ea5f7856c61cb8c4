"""Training-step time of Narang et al. 2021's normalization, depth and sharing rows beside the
vanilla Transformer at the paper's size: bench/token_mixer_steps.py's measurement (forward +
backward, bfloat16, batch x (512, 114)) with these rows' deltas as
t5lite/ablations/modifications.py sets them at paper scale.

    python bench/modification_steps.py --batch 32 --steps 5 --rows vanilla rezero ...
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import token_mixer_steps  # noqa: E402

token_mixer_steps.ROWS.update({
    "rms_norm": dict(norm="rmsnorm"),
    "swiglu": dict(ffn="swiglu", d_ff=2048),
    "rezero": dict(norm="none", rezero=True),
    "fixup": dict(norm="none", fixup=True, dtype="float32"),
    "depth24": dict(num_encoder_layers=24, num_decoder_layers=24, d_ff=1536, num_heads=6),
    "depth6": dict(num_encoder_layers=6, num_decoder_layers=6, d_ff=6144, num_heads=24),
    "block_sharing": dict(share_encoder_block=True, share_decoder_block=True,
                          tie_embeddings=False),
    "factorized_embed": dict(factorized_embed_dim=128, tie_embeddings=False),
    "universal_transformer": dict(share_encoder_block=True, share_decoder_block=True,
                                  tie_embeddings=False, universal_steps=24),
})

if __name__ == "__main__":
    token_mixer_steps.main()
