"""Bit-for-bit digests of every model variant (issue 47: refactors of t5lite/models/ must not
change a single bit): for each preset config (tiny sizes), each row of Narang et al.'s
modifications table (tiny sizes) and a few hand-picked variants, the sha256 of the parameter
tree (paths, shapes, dtypes, values from a fixed init key), of the outputs in eval mode and in
train mode (dropout on, fixed dropout key), of the gradients of a fixed random projection of
the outputs in both modes, and of a few cached decoding steps.

The fixture (tests/model_digests.json) holds each case's ModelConfig (its non-default fields)
and its digests, so what is checked does not drift with configs/ or the ablation tables.
Regenerate it only for an intended change of the numbers:
    python tests/test_model_digests.py --record
The fast test checks the core encoder-decoder, BERT and ELECTRA paths (their layers are
every preset's); the whole table, every modifications row, MoE, Funnel, the flash kernel and
PEFT with it, runs with --runslow: run it before and after any change to t5lite/models/.
(Those variants' behaviour has fast guards of its own: test_moe, test_arch_variants' funnel
tests, test_flash_attention's model equality, test_peft's identity and merge tests; what
only the digests check is bit-exactness under a refactor, which is what --runslow is for.)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import sys

if __name__ == "__main__":  # as conftest does, before jax is imported
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from t5lite import config as config_lib
from t5lite.config import ModelConfig
from t5lite.errors import UserError

FIXTURE = pathlib.Path(__file__).with_name("model_digests.json")
LENGTHS = {"inputs": 16, "targets": 8}
BATCH = 2
TRAIN_DROPOUT = 0.1
# Each case compiles its init, two gradient programs and a decode step, the costliest
# compiles of the fast suite (bench/RESULTS.md, "Test suite wall time": MoE 40 s, PEFT 32 s,
# Funnel 24 s, flash 16 s on the 2-core box), so only the presets' core paths are fast.
FAST = ("t5_1_1_tiny", "bert_tiny", "tiny_electra_rtd")


# ----------------------------------------------------------------------------- digests


def _sha(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
    return h.hexdigest()[:32]


def tree_digest(tree) -> dict:
    """{"structure": hash of paths / shapes / dtypes, "values": hash of the bytes}."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    structure = [(jax.tree_util.keystr(p), tuple(np.shape(v)), str(np.asarray(v).dtype))
                 for p, v in leaves]
    values = [np.ascontiguousarray(np.asarray(v)).tobytes() for _, v in leaves]
    return {"structure": _sha(repr(structure)), "values": _sha(*values)}


# ----------------------------------------------------------------------------- model runs


def _model(cfg):
    from t5lite import peft
    return peft.build_model(cfg)


def random_batch(cfg) -> dict:
    """dummy_batch's keys with random tokens, two packed segments and padding in row 1."""
    from t5lite.models import dummy_batch
    batch = {k: np.array(v) for k, v in dummy_batch(cfg, BATCH, LENGTHS).items()}
    rng = np.random.default_rng(0)
    for name, v in batch.items():
        if v.ndim != 2:
            batch[name] = rng.integers(0, 2, v.shape).astype(np.int32)
            continue
        n = v.shape[1]
        if name.endswith("segment_ids"):
            v[:] = 1
            v[0, n // 2:] = 2
            v[1, n - 2:] = 0
        elif name.endswith("positions"):
            v[:] = np.arange(n)
            v[0, n // 2:] = np.arange(n - n // 2)
        elif name.endswith(("tokens", "labels")):
            v[:] = rng.integers(1, cfg.vocab_size if "tokens" in name else 2, v.shape)
        elif name.endswith(("weights", "causal_attention")):
            v[:] = rng.integers(0, 2, v.shape)
        elif name.startswith("encoder_span_"):
            v[:] = rng.integers(0, n, v.shape)
    if "encoder_input_tokens" in batch and "encoder_segment_ids" in batch:
        batch["encoder_input_tokens"][1, -2:] = 0
    return {k: jnp.asarray(v) for k, v in batch.items()}


def _outputs(model, params, batch, deterministic, rng):
    from t5lite.models import moe
    return moe.apply_with_aux_loss(model, {"params": params}, batch, deterministic=deterministic,
                                   rngs={"dropout": rng})


def _float_outputs(out):
    return {k: v for k, v in out.items() if jnp.issubdtype(v.dtype, jnp.floating)}


def _loss(model, batch, deterministic, rng, params):
    """A fixed random projection of the float outputs, and the outputs."""
    out = _outputs(model, params, batch, deterministic, rng)
    total = 0.0
    for i, (k, v) in enumerate(sorted(_float_outputs(out).items())):
        w = jax.random.normal(jax.random.fold_in(jax.random.key(7), i), v.shape, jnp.float32)
        finite = jnp.where(v > -1e9, v.astype(jnp.float32), 0.0)  # masked span logits
        total = total + jnp.sum(finite * w)
    return total, out


def _decode_digest(model, params, batch, cfg) -> str:
    """Logits of a 3-token prefill then 1 token with the KV cache (decoders only)."""
    from t5lite.models import init_cache
    tokens = batch.get("decoder_input_tokens")
    enc = batch.get("encoder_input_tokens") if cfg.architecture == "encoder_decoder" else None
    cache = init_cache(model, params, BATCH, tokens.shape[1], enc)

    @jax.jit
    def run(params, cache):
        kwargs = {}
        if enc is not None:
            kwargs = dict(encoded=model.apply({"params": params}, enc, method="encode"),
                          encoder_input_tokens=enc)
        logits = []
        for lo, hi in ((0, 3), (3, 4)):
            out, state = model.apply({"params": params, "cache": cache}, tokens[:, lo:hi],
                                     decode=True, mutable=["cache"], method="decode", **kwargs)
            cache = state["cache"]
            logits.append(out)
        return logits

    return tree_digest(run(params, cache))["values"]


def _guarded(fn):
    try:
        return fn()
    except UserError as err:
        return f"UserError: {str(err)[:60]}"


def digests(cfg: ModelConfig) -> dict:
    """Every digest of one config (see the module docstring)."""
    model = _model(cfg)
    batch = random_batch(cfg)
    variables = jax.jit(functools.partial(model.init, deterministic=True))(
        {"params": jax.random.key(0), "dropout": jax.random.key(1)}, batch)
    params = nn.meta.unbox(variables["params"])
    out = {"params": tree_digest(params)}
    drop = cfg.dropout_rate if cfg.attention_kernel == "flash" else TRAIN_DROPOUT
    train_model = _model(dataclasses.replace(cfg, dropout_rate=drop))
    for mode, m, det in (("eval", model, True), ("train", train_model, False)):
        step = jax.jit(jax.value_and_grad(functools.partial(_loss, m, batch, det,
                                                            jax.random.key(2)), has_aux=True))

        def run():
            (_, outputs), grads = step(params)
            return ({k: tree_digest(v)["values"] for k, v in outputs.items()},
                    tree_digest(grads)["values"])

        result = _guarded(run)
        out[f"{mode}_outputs"], out[f"{mode}_grads"] = (
            result if isinstance(result, tuple) else (result, result))
    if cfg.architecture != "encoder_only":
        out["decode"] = _guarded(lambda: _decode_digest(model, params, batch, cfg))
    return out


# ----------------------------------------------------------------------------- the cases


def _model_dict(m: ModelConfig) -> dict:
    """The fields of ``m`` that differ from ModelConfig's defaults (nested: dotted)."""
    full = config_lib.flatten(config_lib.to_dict(config_lib.Config(model=m))["model"])
    default = config_lib.flatten(config_lib.to_dict(config_lib.Config())["model"])
    return {k: v for k, v in full.items() if v != default.get(k)}


def model_config(fields: dict) -> ModelConfig:
    cfg = config_lib.Config()
    for key, value in fields.items():
        value = tuple(tuple(x) if isinstance(x, list) else x for x in value) if isinstance(
            value, list) else value
        config_lib.set_by_path(cfg, f"model.{key}", value)
    config_lib.check_model(cfg.model)
    return cfg.model


SMALL = ("model.d_model=32", "model.num_heads=4", "model.head_dim=8", "model.d_ff=64",
         "model.vocab_size=256", "model.num_encoder_layers=3", "model.num_decoder_layers=3",
         "model.max_length=32")
PKM_SMALL = dict(pkm_keys=8, pkm_heads=2, pkm_knn=3, pkm_key_dim=8)


def _preset_cases() -> dict:
    cases = {}
    for name in sorted(config_lib.available_configs()):
        if "tiny" not in name and "quickstart" not in name:
            continue
        m = config_lib.load_config(name).model
        cases[name] = dataclasses.replace(m, vocab_size=512)
    return cases


def _row_cases() -> dict:
    from t5lite.ablations.modifications import TABLE
    from t5lite.ablations.plan import plan_row
    cases = {}
    for row in TABLE.rows:
        pre, _ = plan_row(TABLE, row, "/w", [], "tiny", overrides=SMALL)
        m = pre.cfg.model
        if m.ffn_layer == "pkm":
            m = dataclasses.replace(m, **PKM_SMALL)
        cases[f"row/{row.name}"] = m
    return cases


def _extra_cases() -> dict:
    base = dict(vocab_size=128, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                num_encoder_layers=2, num_decoder_layers=2, max_length=32, dropout_rate=0.0)
    t = lambda **kw: ModelConfig(**{**base, **kw})  # noqa: E731
    peft = config_lib.PeftConfig
    return {
        "extra/flash": t(attention_kernel="flash"),
        "extra/flash_alibi_gpt": t(attention_kernel="flash", architecture="decoder_only",
                                   position="alibi"),
        "extra/dropout_broadcast": t(dropout_broadcast="length"),
        "extra/mesh_tf_init": t(initializers="mesh_tf", ffn_init_scale=0.5),
        "extra/encoder_norm": t(norm="layernorm", encoder_norm="rmsnorm"),
        "extra/prefix_lm_rope": t(architecture="prefix_lm", position="rope"),
        "extra/shared_encoder_decoder": t(shared_encoder_decoder=True),
        "extra/unscanned_remat": t(scan_layers=False, remat="minimal"),
        "extra/scan_unroll_full_remat": t(scan_unroll=0, remat="full"),
        "extra/sinusoidal_untied": t(position="sinusoidal", tie_embeddings=False,
                                     tie_encoder_decoder_embeddings=False),
        "extra/accelerator_rules": t(gradient_rules="accelerator", ffn="geglu"),
        "extra/unflat_kernels": t(flat_kernels=False, use_bias=True),
        "extra/embed_like_classifier": t(embed_like_classifier=True, scale_tied_logits=False),
        "extra/bert_predict_fraction": t(architecture="encoder_only", position="learned",
                                         mlm_predict_fraction=0.5, nsp_head=True,
                                         num_token_types=2, pre_norm=False, norm="layernorm",
                                         embed_norm=True, use_bias=True, embed_dim=16,
                                         num_classes=3, num_token_classes=4, span_head=True),
        "extra/gpt_classes": t(architecture="decoder_only", position="learned", num_classes=3),
        "extra/moe_decoder_only_at": t(architecture="decoder_only", ffn_layer="switch",
                                       num_experts=4, ffn_layer_at=(0,), router_jitter=0.1),
        "extra/universal_plain": t(universal_steps=3),
        "extra/universal_gru_rezero": t(universal_steps=2, universal_mix_layers=1,
                                        universal_gating="gru", rezero=True),
        "extra/evolved_gpt": t(architecture="decoder_only", block_type="evolved"),
        "extra/conv_heads_gpt": t(architecture="decoder_only", attention_type="dynamic_conv",
                                  conv_heads=4),
        "extra/weighted_encoder_only": t(architecture="encoder_only", weighted_transformer=True,
                                         scan_layers=False),
        "extra/funnel_bert": t(architecture="encoder_only", funnel_blocks=(1, 1),
                               encoder_norm="layernorm"),
        "extra/peft_lora_prefix_adapter": t(peft=peft(lora_rank=2, prefix_tokens=2,
                                                      adapter_dim=4, lora_targets=(
                                                          "query", "value", "wi", "wo"))),
        "extra/peft_prompt": t(peft=peft(prompt_tokens=3, ia3=True)),
        "extra/peft_prompt_gpt": t(architecture="decoder_only", peft=peft(prompt_tokens=2)),
        "extra/peft_lora_unscanned_bert": t(architecture="encoder_only", scan_layers=False,
                                            position="learned", peft=peft(lora_rank=2)),
        "extra/electra_generator": t(architecture="encoder_only", position="learned",
                                     electra=config_lib.ElectraConfig(
                                         rtd_head=True, generator_d_model=16)),
        "extra/fixup_rezero_sharing": t(norm="none", fixup=True, share_encoder_block=True),
    }


def all_cases() -> dict:
    return {**_preset_cases(), **_row_cases(), **_extra_cases()}


def record(part: int = 0, parts: int = 1) -> None:
    """Write the fixture (``parts`` > 1: this process's share of the cases, the representative
    ones first, to <fixture>.<part>; merge the shares with --merge)."""
    names = sorted(all_cases(), key=lambda n: (n not in FAST, n))[part::parts]
    cases = all_cases()
    out = {}
    target = FIXTURE if parts == 1 else FIXTURE.with_suffix(f".json.{part}")
    for name in names:
        m = cases[name]
        fields = _model_dict(m)
        assert model_config(fields) == m, name  # the fixture rebuilds the same config
        out[name] = {"model": fields, "digests": digests(m)}
        target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(name, flush=True)


def merge(parts: int) -> None:
    out = {}
    for part in range(parts):
        out.update(json.loads(FIXTURE.with_suffix(f".json.{part}").read_text()))
    FIXTURE.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- the tests


def _load() -> dict:
    return json.loads(FIXTURE.read_text())


def _check(name: str) -> None:
    case = _load()[name]
    got = digests(model_config(case["model"]))
    want = case["digests"]
    diff = {k: (want.get(k), got.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
    assert not diff, f"{name}: digests changed: {diff}"


@pytest.mark.parametrize("name", FAST)
def test_representative_models_are_bit_identical(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(json.loads(FIXTURE.read_text())) - set(FAST))
                         if FIXTURE.exists() else [])
def test_every_model_is_bit_identical(name):
    _check(name)


if __name__ == "__main__":
    if sys.argv[1:] == ["--record"]:
        record()
    elif sys.argv[1:2] == ["--record"] and len(sys.argv) == 4:  # --record PART PARTS
        record(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1:2] == ["--merge"] and len(sys.argv) == 3:
        merge(int(sys.argv[2]))
    else:
        sys.exit("usage: python tests/test_model_digests.py --record [PART PARTS] | --merge PARTS")
