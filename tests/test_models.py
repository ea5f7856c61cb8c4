"""Model tests on tiny configs: masks, packing, KV cache, scan/remat equivalence, variants, sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from t5lite.config import ModelConfig
from t5lite.models import PUBLISHED, build_model, count_params, dummy_batch, init_cache
from t5lite.config import load_config


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0)
    base.update(kw)
    return ModelConfig(**base)


def init(cfg, batch, seed=0):
    model = build_model(cfg)
    variables = model.init({"params": jax.random.key(seed), "dropout": jax.random.key(1)},
                           batch, deterministic=True)
    return model, nn.meta.unbox(variables["params"])


def random_batch(cfg, b=2, n_in=8, n_tgt=6, seed=0):
    batch = dummy_batch(cfg, b, {"inputs": n_in, "targets": n_tgt})
    rng = np.random.default_rng(seed)
    for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
              "encoder_target_tokens"):
        if k in batch:
            batch[k] = rng.integers(1, cfg.vocab_size, batch[k].shape).astype(np.int32)
    for k in ("encoder_positions", "decoder_positions"):
        if k in batch:
            batch[k] = np.broadcast_to(np.arange(batch[k].shape[1]), batch[k].shape).astype(
                np.int32)
    return batch


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only", "prefix_lm",
                                  "encoder_only"])
def test_smoke_every_architecture(arch):
    cfg = tiny(architecture=arch, num_classes=0 if arch == "encoder_decoder" else 3,
               nsp_head=arch == "encoder_only", dropout_rate=0.1)
    batch = random_batch(cfg)
    model, params = init(cfg, batch)
    out = model.apply({"params": params}, batch, deterministic=False,
                      rngs={"dropout": jax.random.key(3)})
    n = batch.get("decoder_input_tokens", batch.get("encoder_input_tokens")).shape[1]
    assert out["logits"].shape == (2, n, cfg.vocab_size)
    assert out["logits"].dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(out["logits"])))
    if arch != "encoder_decoder":
        assert out["class_logits"].shape == (2, 3)
    if arch == "encoder_only":
        assert out["nsp_logits"].shape == (2, 2)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published(name):
    cfg = load_config(name).model
    got = count_params(cfg, heads=False)
    assert abs(got - PUBLISHED[name]) / PUBLISHED[name] < 0.005, (name, got)
