"""Numerical parity with Hugging Face PyTorch on converted random weights, float32, padded batches.

Each HF model gets nonzero random values in every tensor (tests/hf_fixtures.py), is saved with
save_pretrained, converted with t5lite.convert.hf_to_t5lite, and both run the same padded batch
(HF attention_mask -> t5lite segment ids 1 / 0). Only non-pad positions are compared.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import hf_fixtures as F
from t5lite import convert
from t5lite.models import build_model

TOL = F.PARITY_TOL

BATCHES = {"t5_v1_0": F.t5_batches, "t5_v1_1": F.t5_batches, "bert": F.bert_batches,
           "gpt2": F.gpt2_batches}


def _hf_logits(model, hf_batch):
    with torch.no_grad():
        out = model(**hf_batch)
    logits = out.logits if hasattr(out, "logits") else out.prediction_logits
    nsp = getattr(out, "seq_relationship_logits", None)
    return logits.numpy(), None if nsp is None else nsp.numpy()


_JITTED = {}


def _ours(cfg, params, batch):
    """Jitted forward, one compile per model config (reused for the ablation below)."""
    key = repr(cfg.model)
    if key not in _JITTED:
        model = build_model(cfg.model)
        _JITTED[key] = jax.jit(
            lambda p, b: model.apply({"params": p}, b, deterministic=True))
    out = _JITTED[key](params, {k: jnp.asarray(v) for k, v in batch.items()})
    return {k: np.asarray(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """One saved random HF model per kind, shared by the scan / unrolled cases."""
    return {kind: F.save_hf_model(F.make_hf_model(kind, seed=3), tmp_path_factory.mktemp(kind))
            for kind in BATCHES}


CASES = [(k, True) for k in BATCHES] + [("t5_v1_1", False), ("bert", False)]


@pytest.mark.parametrize("kind,scan_layers", CASES,
                         ids=[f"{k}-{'scan' if s else 'unrolled'}" for k, s in CASES])
def test_logits_match_hf(kind, scan_layers, hf_dirs):
    hf_dir = hf_dirs[kind]
    hf_model = F.load_hf_model(hf_dir)  # what from_pretrained sees (eager attention)
    cfg, params = convert.hf_to_t5lite(hf_dir, scan_layers=scan_layers)
    assert cfg.model.scan_layers == scan_layers

    hf_batch, batch, mask_BL = BATCHES[kind](np.random.default_rng(7))
    assert (mask_BL == 0).any(), "the batch must contain padding"
    ref_BLV, ref_nsp = _hf_logits(hf_model, hf_batch)
    out = _ours(cfg, params, batch)
    assert out["logits"].shape == ref_BLV.shape
    real = mask_BL.astype(bool)
    diff = float(np.abs(out["logits"] - ref_BLV)[real].max())
    print(f"\n{kind} scan_layers={scan_layers}: max |logit diff| = {diff:.2e} "
          f"(logit std {ref_BLV[real].std():.2f}, tolerance {TOL:g})")
    assert diff <= TOL
    if kind == "bert":
        nsp_diff = float(np.abs(out["nsp_logits"] - ref_nsp).max())
        print(f"bert NSP: max |logit diff| = {nsp_diff:.2e}")
        assert nsp_diff <= TOL
    # The comparison has teeth: the same weights with one layer-norm bias off move the logits.
    name = {"t5_v1_0": ("decoder", "decoder_norm", "scale"),
            "t5_v1_1": ("encoder", "encoder_norm", "scale"),
            "bert": ("encoder", "embed_norm", "bias"),
            "gpt2": ("decoder", "decoder_norm", "bias")}[kind]
    node = params
    for k in name[:-1]:
        node = node[k]
    node[name[-1]] = node[name[-1]] + 0.05
    assert np.abs(_ours(cfg, params, batch)["logits"] - ref_BLV)[real].max() > 100 * TOL
