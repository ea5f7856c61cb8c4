"""Digests of every model variant (issue 47: refactors of t5lite/models/ must not change a
single bit): for each preset config (tiny sizes), each row of Narang et al.'s modifications
table (tiny sizes) and a few hand-picked variants, the parameter tree (paths, shapes, dtypes,
values from a fixed init key), the outputs in eval mode and in train mode (dropout on, fixed
dropout key), the gradients of a fixed random projection of the outputs in both modes, and a
few cached decoding steps.

Each is pinned twice (tests/model_digests.json):
- a fingerprint any CPU reproduces: structure and integer leaves exactly, float leaves by their
  L1 norm, L2 norm and a fixed random projection within FLOAT_RTOL. XLA:CPU compiles for the
  host's instruction set, so the same program rounds differently on another CPU family (the
  fixture's first bit-exact digests failed on an AMD EPYC (AVX2) host at an unchanged
  commit); the fingerprints are what CI checks on any machine. Mask fills (<= -1e9) are pinned
  by position, so they cannot swamp the sums.
- the sha256 of every value, bit for bit, with the host it was recorded on (host_key():
  machine, jaxlib, CPU vendor / family / model, vector ISA and the code-generation flags in
  XLA_FLAGS: the suite's LLVM -O0, tests/suite_xla.py). Checked only on that kind of host; on
  another the test checks the fingerprints and warns that the bits went unchecked. For a
  refactor, record at the base commit on your machine, then check after the change:
  bit-exactness on one host is the promise issue 47 asks for.

Regenerate it only for an intended change of the numbers (or to pin a new host's bits):
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
import platform
import sys
import warnings

if __name__ == "__main__":  # as conftest does, before jax is imported: record as the suite runs
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import suite_xla
    suite_xla.apply()
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
# What another CPU's rounding moves a float fingerprint by, with a margin: the fast cases'
# programs built for AVX2, for SSE4.2 and at LLVM -O2 / -O0 moved them by at most 2.2e-6
# relative (bench/RESULTS.md, "Model digests across CPUs"); a changed layer moves them more.
FLOAT_RTOL = 1e-4


# ----------------------------------------------------------------------------- digests


def _sha(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
    return h.hexdigest()[:32]


def _cpu_fields() -> dict:
    """Vendor, family, model and vector ISA of this CPU (Linux); {} where /proc/cpuinfo is not."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("vendor_id", "cpu family", "model", "flags", "Features", "CPU part"):
            fields.setdefault(key, value.strip())
    isa = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
           "avx512_fp16", "avx_vnni", "amx_bf16", "asimd", "sve", "sve2")
    flags = set((fields.pop("flags", "") + " " + fields.pop("Features", "")).split())
    fields["isa"] = " ".join(f for f in isa if f in flags)
    return fields


def host_key() -> str:
    """What decides XLA:CPU's generated code, so its bits: machine, jaxlib, the CPU's kind and
    the code-generation flags in XLA_FLAGS (the suite's LLVM -O0: tests/suite_xla.py)."""
    import jaxlib
    cpu = _cpu_fields()
    codegen = sorted(f for f in os.environ.get("XLA_FLAGS", "").split()
                     if f.startswith(("--xla_backend", "--xla_cpu", "--xla_llvm")))
    return " | ".join([platform.machine(), f"jaxlib {jaxlib.__version__}"]
                      + [f"{k} {v}" for k, v in sorted(cpu.items())] + codegen)


def _structure_sha(tree) -> str:
    """Hash of the tree's paths, shapes and dtypes."""
    return _sha(repr([(jax.tree_util.keystr(p), tuple(np.shape(v)), str(np.asarray(v).dtype))
                      for p, v in jax.tree_util.tree_leaves_with_path(tree)]))


def tree_digest(tree) -> dict:
    """{"structure": hash of paths / shapes / dtypes, "values": hash of the bytes}."""
    values = [np.ascontiguousarray(np.asarray(v)).tobytes()
              for v in jax.tree_util.tree_leaves(tree)]
    return {"structure": _structure_sha(tree), "values": _sha(*values)}


def tree_fingerprint(tree) -> dict:
    """What any CPU reproduces of ``tree``: its structure, integer leaves and where float leaves
    hold mask fills (<= -1e9, non-finite) exactly; the other float values as L1 norm, L2 norm and
    a projection on fixed normal weights (float64 sums), so a fill cannot swamp the sums."""
    leaves = [np.asarray(v) for v in jax.tree_util.tree_leaves(tree)]
    exact = []
    l1 = l2 = proj = 0.0
    for i, v in enumerate(leaves):
        if not np.issubdtype(v.dtype, np.floating):
            exact.append(np.ascontiguousarray(v).tobytes())
        else:
            x = v.astype(np.float64).ravel()
            fill = ~(np.isfinite(x) & (x > -1e9))
            exact.append(np.packbits(fill).tobytes())
            x = np.where(fill, 0.0, x)
            l1 += float(np.abs(x).sum())
            l2 += float(np.square(x).sum())
            proj += float(x @ np.random.default_rng(i).standard_normal(x.size))
    return {"structure": _structure_sha(tree), "exact": _sha(*exact),
            "l1": l1, "l2": float(np.sqrt(l2)), "proj": proj}


def fingerprint_diff(want, got, where: str = "") -> list[str]:
    """Where two fingerprint records differ beyond another CPU's rounding (FLOAT_RTOL)."""
    if isinstance(want, dict) and isinstance(got, dict) and "l1" in want and "l1" in got:
        out = [f"{where}.{k}: {want[k]} != {got[k]}" for k in ("structure", "exact")
               if want[k] != got[k]]
        scale = max(abs(want["l2"]), abs(got["l2"]), 1e-30)
        for k, ref in (("l1", abs(want["l1"])), ("l2", scale), ("proj", scale)):
            if not abs(want[k] - got[k]) <= FLOAT_RTOL * max(ref, 1e-30):
                out.append(f"{where}.{k}: {want[k]!r} != {got[k]!r} "
                           f"(relative {abs(want[k] - got[k]) / max(ref, 1e-30):.1e})")
        return out
    if isinstance(want, dict) and isinstance(got, dict):
        return [d for k in sorted(set(want) | set(got))
                for d in fingerprint_diff(want.get(k), got.get(k), f"{where}.{k}".lstrip("."))]
    return [] if want == got else [f"{where}: {want!r} != {got!r}"]


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


def _decode_logits(model, params, batch, cfg):
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

    return run(params, cache)


def _guarded(fn):
    try:
        return fn()
    except UserError as err:
        return f"UserError: {str(err)[:60]}"


def _pinned(trees: dict) -> tuple[dict, dict]:
    """({name: bit-exact sha}, {name: fingerprint}); a refused run pins its one-line error."""
    exact, fingerprint = {}, {}
    for name, tree in trees.items():
        if isinstance(tree, str):
            exact[name] = fingerprint[name] = tree
        elif name.endswith("_outputs"):
            exact[name] = {k: tree_digest(v)["values"] for k, v in tree.items()}
            fingerprint[name] = {k: tree_fingerprint(v) for k, v in tree.items()}
        else:
            exact[name] = tree_digest(tree) if name == "params" else tree_digest(tree)["values"]
            fingerprint[name] = tree_fingerprint(tree)
    return exact, fingerprint


def digests(cfg: ModelConfig) -> tuple[dict, dict]:
    """(bit-exact digests, fingerprints) of one config (see the module docstring)."""
    model = _model(cfg)
    batch = random_batch(cfg)
    variables = jax.jit(functools.partial(model.init, deterministic=True))(
        {"params": jax.random.key(0), "dropout": jax.random.key(1)}, batch)
    params = nn.meta.unbox(variables["params"])
    trees = {"params": params}
    drop = cfg.dropout_rate if cfg.attention_kernel == "flash" else TRAIN_DROPOUT
    train_model = _model(dataclasses.replace(cfg, dropout_rate=drop))
    for mode, m, det in (("eval", model, True), ("train", train_model, False)):
        step = jax.jit(jax.value_and_grad(functools.partial(_loss, m, batch, det,
                                                            jax.random.key(2)), has_aux=True))

        def run():
            (_, outputs), grads = step(params)
            return jax.device_get(outputs), jax.device_get(grads)

        result = _guarded(run)
        trees[f"{mode}_outputs"], trees[f"{mode}_grads"] = (
            result if isinstance(result, tuple) else (result, result))
    if cfg.architecture != "encoder_only":
        trees["decode"] = _guarded(lambda: jax.device_get(
            _decode_logits(model, params, batch, cfg)))
    return _pinned(trees)


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
    host = host_key()
    for name in names:
        m = cases[name]
        fields = _model_dict(m)
        assert model_config(fields) == m, name  # the fixture rebuilds the same config
        exact, fingerprint = digests(m)
        out[name] = {"model": fields, "digests": exact, "host": host, "fingerprint": fingerprint}
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
    exact, fingerprint = digests(model_config(case["model"]))
    diff = fingerprint_diff(case["fingerprint"], fingerprint)
    assert not diff, f"{name}: fingerprints changed beyond rounding: {diff}"
    host = host_key()
    if case["host"] != host:  # said where CI shows it, not a skip: the test did check
        warnings.warn(f"{name}: fingerprints match; bit-exact digests not checked: recorded on "
                      f"another kind of host ({case['host']}; this is {host}). For a "
                      "refactor: `python tests/test_model_digests.py --record` at its base, "
                      "then rerun after the change")
        return
    want = case["digests"]
    diff = {k: (want.get(k), exact.get(k)) for k in set(want) | set(exact)
            if want.get(k) != exact.get(k)}
    assert not diff, f"{name}: digests changed: {diff}"


def test_fingerprints_tell_rounding_from_a_change():
    rng = np.random.default_rng(0)
    tree = {"w": rng.standard_normal((4, 8)).astype(np.float32), "ids": np.arange(5),
            "logits": np.array([0.5, -1e10, 2.0], np.float32)}
    want = tree_fingerprint(tree)

    def moved(**changes):
        return fingerprint_diff(want, tree_fingerprint({**tree, **changes}))

    w = tree["w"]
    assert moved() == []
    assert moved(w=w * np.float32(1 + 1e-6)) == []  # another CPU's rounding
    assert moved(w=w * np.float32(1 + 1e-3))  # a changed scale
    assert moved(w=-w)  # a flipped sign keeps both norms: the projection sees it
    assert moved(w=w.T.copy().reshape(4, 8))  # the same values elsewhere
    assert moved(ids=np.arange(1, 6))
    assert moved(logits=np.array([0.5, 3.0, 2.0], np.float32))  # a mask moved
    assert moved(w=w.astype(np.float64))  # dtype: the structure


@pytest.mark.parametrize("name", FAST)
def test_representative_models_are_unchanged(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(json.loads(FIXTURE.read_text())) - set(FAST))
                         if FIXTURE.exists() else [])
def test_every_model_is_unchanged(name):
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
