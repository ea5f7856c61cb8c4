"""Training-step time of the Narang et al. 2021 token-mixer and output-layer rows beside the
vanilla Transformer, at the paper's model size, on whatever accelerator JAX finds.

Forward + backward (no optimizer update) of the paper-scale model (T5 1.0 base sizes: 12 + 12
layers, d_model 768, 12 heads, d_ff 3072, vocabulary 32,128; the rows' deltas as
t5lite/ablations/modifications.py sets them), bfloat16 compute, inputs 512 and targets 114 as
the paper's pretraining. Prints one JSON line per row: seconds per step (median of the timed
steps), steps per second and the ratio to vanilla, for comparison with the paper's Step/s
ratios (which it measured on TPU).

    python bench/token_mixer_steps.py --batch 32 --rows vanilla dynamic_conv ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from t5lite.config.model_schema import ModelConfig
from t5lite.models import build_model, dummy_batch

VANILLA = dict(vocab_size=32128, d_model=768, num_heads=12, head_dim=64, d_ff=3072,
               num_encoder_layers=12, num_decoder_layers=12, ffn="relu", norm="layernorm",
               pre_norm=True, position="relative", tie_embeddings=True,
               scale_tied_logits=True, dropout_rate=0.0, dtype="bfloat16",
               gradient_rules="accelerator")
SOFTMAX_CLUSTERS = ("2500:0", "6000:256", "23500:64", "128:0")
ROWS = {
    "vanilla": {},
    "dynamic_conv": dict(attention_type="dynamic_conv", d_ff=512),
    "lightweight_conv": dict(attention_type="lightweight_conv"),
    "evolved_transformer": dict(block_type="evolved", num_encoder_layers=6,
                                num_decoder_layers=6),
    "synthesizer_dense": dict(attention_type="synthesizer_dense"),
    "synthesizer_factorized": dict(attention_type="synthesizer_factorized"),
    "synthesizer_random_plus_alpha": dict(attention_type="synthesizer_random_plus_alpha"),
    "adaptive_softmax": dict(output_softmax="adaptive", vocab_clusters=SOFTMAX_CLUSTERS),
    "adaptive_input": dict(adaptive_input=True,
                           vocab_clusters=("2500:0", "6000:256", "23628:64")),
    "mixture_of_softmaxes": dict(output_softmax="mixture", mos_components=15),
}


def step_seconds(name: str, batch_size: int, steps: int) -> dict:
    cfg = dataclasses.replace(ModelConfig(), **{**VANILLA, **ROWS[name]})
    model = build_model(cfg)
    batch = dummy_batch(cfg, batch_size, {"inputs": 512, "targets": 114})
    rng = np.random.default_rng(0)
    batch = {k: jnp.asarray(rng.integers(1, cfg.vocab_size, v.shape).astype(np.int32)
                            if k.endswith("_tokens") else v) for k, v in batch.items()}
    params = jax.jit(lambda: model.init(jax.random.key(0), batch)["params"])()

    def loss(p):
        logits = model.apply({"params": p}, batch)["logits"]
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, batch["decoder_target_tokens"][..., None],
                                             axis=-1))

    grad = jax.jit(jax.value_and_grad(loss))
    t0 = time.perf_counter()
    jax.block_until_ready(grad(params))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(grad(params))
        times.append(time.perf_counter() - t0)
    n = sum(x.size for x in jax.tree.leaves(params))
    return dict(row=name, params_m=round(n / 1e6, 1), batch=batch_size,
                step_s=statistics.median(times), compile_s=round(compile_s, 1),
                device=jax.devices()[0].device_kind)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", nargs="*", default=list(ROWS))
    args = parser.parse_args()
    base = None
    for name in args.rows:
        out = step_seconds(name, args.batch, args.steps)
        base = out["step_s"] if name == "vanilla" else base
        out["steps_per_s"] = round(1 / out["step_s"], 2)
        out["vs_vanilla"] = round(base / out["step_s"], 3) if base else None
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
