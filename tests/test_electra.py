"""ELECTRA: replaced-token labels, the MLM + lambda * RTD loss, no RTD gradient into the
generator, HF ElectraForPreTraining parity and exact round trip, presets, a tiny training run."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

import hf_fixtures as F
from t5lite import convert
from t5lite.models import build_model, count_params, electra
from t5lite.train import losses, trainer
from train_helpers import synthetic_batch, tf_iterator, tiny_config

MASK_ID = 127  # train_helpers.synthetic_batch writes V - 1 at the masked positions


def _cfg(rtd_weight=50.0, predict_fraction=0.0):
    cfg = tiny_config("encoder_only", batch_size=8, length=16)
    m = cfg.model
    m.norm, m.pre_norm, m.embed_norm, m.use_bias, m.ffn = "layernorm", False, True, True, "gelu"
    m.num_token_types, m.init_std, m.embed_dim = 2, 0.02, 16  # narrower embeddings: projected
    m.scale_attn_logits, m.scale_tied_logits = True, False
    m.mlm_predict_fraction = predict_fraction
    m.electra = dataclasses.replace(m.electra, rtd_head=True, generator_d_model=8,
                                    rtd_weight=rtd_weight)
    cfg.train.z_loss = 0.0
    return cfg


def _init(cfg, batch):
    model = build_model(cfg.model)
    params = jax.jit(lambda: model.init({"params": jax.random.key(0)}, batch)["params"])()
    return model, jax.tree.map(np.asarray, nn.meta.unbox(params))


def test_generator_shares_the_embeddings_and_is_narrower():
    cfg = _cfg()
    batch = synthetic_batch(cfg, np.random.default_rng(0))
    _, params = _init(cfg, batch)
    assert "generator" in params and "position_embedder" not in params["generator"]
    assert params["token_embedder"]["embedding"].shape == (128, 16)
    assert params["encoder"]["embed_project"]["kernel"].shape == (16, 32)
    assert params["generator"]["embed_project"]["kernel"].shape == (16, 8)
    g = electra.generator_config(cfg.model)  # a quarter of the width, FFN and heads
    assert (g.d_model, g.num_heads, g.head_dim, g.d_ff) == (8, 1, 8, 16)
    # model.embed_dim on plain BERT too: factorised embeddings, the tied MLM head at width E
    from t5lite.models import abstract_params
    bert = dataclasses.replace(cfg.model, electra=type(cfg.model.electra)())
    shapes = jax.tree.map(lambda x: x.shape, nn.meta.unbox(abstract_params(bert)))
    assert shapes["mlm_dense"]["kernel"] == (32, 16)
    assert shapes["encoder"]["embed_project"]["kernel"] == (16, 32)
    # electra_small: HF electra-small-discriminator sizes, generator 1/4 wide (paper Table 6)
    from t5lite.config import load_config
    small = load_config("electra_small").model
    assert (small.d_model, small.embed_dim, small.num_encoder_layers) == (256, 128, 12)
    assert small.electra.generator_d_model == 64 and small.electra.rtd_weight == 50.0
    # ElectraModel (small discriminator without its head): 13.48M parameters
    assert count_params(dataclasses.replace(
        small, electra=dataclasses.replace(small.electra, generator_d_model=0)),
        heads=False) == 13_483_008


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_rtd_labels_are_exactly_token_differs_from_original(fraction):
    """A generator that puts all its mass on one token t: every masked position becomes t,
    labelled 1 where the original differs and 0 where the original is t; unmasked tokens keep
    their input and label 0; padding has weight 0."""
    cfg = _cfg(predict_fraction=fraction)
    rng = np.random.default_rng(1)
    batch = synthetic_batch(cfg, rng)
    t = int(batch["encoder_target_tokens"][0, 0])  # position 0 is always masked
    batch["encoder_target_tokens"][1, :] = t  # row 1: the generator always samples the original
    batch["encoder_input_tokens"][1] = np.where(batch["encoder_loss_weights"][1] > 0, MASK_ID, t)
    batch["encoder_segment_ids"][2, 12:] = 0  # row 2: padding at the end
    batch["encoder_loss_weights"][2, 12:] = 0
    model, params = _init(cfg, batch)
    params["generator_mlm_bias"] = np.zeros_like(params["generator_mlm_bias"])
    params["generator_mlm_bias"][t] = 1e4
    out = model.apply({"params": params}, batch, deterministic=False,
                      rngs={"dropout": jax.random.key(3)})
    w = batch["encoder_loss_weights"] > 0
    corrupt = np.asarray(out["corrupted_tokens"])
    np.testing.assert_array_equal(corrupt[w], t)
    np.testing.assert_array_equal(corrupt[~w], batch["encoder_input_tokens"][~w])
    real = batch["encoder_segment_ids"] != 0
    want = ((corrupt != batch["encoder_target_tokens"]) & real).astype(np.int32)
    np.testing.assert_array_equal(out["rtd_labels"], want)
    np.testing.assert_array_equal(out["rtd_labels"][~w], 0)
    assert out["rtd_labels"][1].sum() == 0 and out["rtd_labels"][0].sum() > 0
    np.testing.assert_array_equal(out["rtd_weights"], real)


def test_sampling_follows_the_generator_and_differs_per_key():
    cfg = _cfg()
    batch = synthetic_batch(cfg, np.random.default_rng(2))
    model, params = _init(cfg, batch)
    a, b = (np.asarray(model.apply({"params": params}, batch, deterministic=False,
                                   rngs={"dropout": jax.random.key(k)})["corrupted_tokens"])
            for k in (0, 1))
    w = batch["encoder_loss_weights"] > 0
    assert (a[w] != b[w]).any()  # a near-uniform fresh generator: samples, not an argmax
    assert not (a[w] == MASK_ID).any()  # every masked position is replaced


def test_loss_is_mlm_plus_lambda_times_rtd():
    batch = synthetic_batch(_cfg(), np.random.default_rng(4))
    model, params = _init(_cfg(), batch)
    out = model.apply({"params": params}, batch, deterministic=True)
    l50, m50 = losses.compute_loss(_cfg(50.0), out, batch)
    l0, m0 = losses.compute_loss(_cfg(0.0), out, batch)
    mlm, _ = losses.compute_loss(_cfg(), {"logits": out["logits"]}, batch)  # generator alone
    np.testing.assert_allclose(m0["mlm_loss"], mlm, rtol=1e-6)
    np.testing.assert_allclose(l0, mlm, rtol=1e-6)
    # RTD: mean binary cross entropy over real tokens, by hand
    x, y = np.asarray(out["rtd_logits"], np.float64), np.asarray(out["rtd_labels"])
    w = np.asarray(out["rtd_weights"])
    bce = np.logaddexp(0, x) - x * y
    np.testing.assert_allclose(m50["rtd_loss"], (bce * w).sum() / w.sum(), rtol=1e-5)
    np.testing.assert_allclose(l50, mlm + 50.0 * m50["rtd_loss"], rtol=1e-5)
    assert 0 < m50["replaced_fraction"] < 0.3


def test_rtd_loss_sends_no_gradient_into_the_generator():
    cfg = _cfg()
    batch = synthetic_batch(cfg, np.random.default_rng(5))
    model, params = _init(cfg, batch)

    def rtd(p):
        out = model.apply({"params": p}, batch, deterministic=False,
                          rngs={"dropout": jax.random.key(0)})
        return losses.compute_loss(cfg, out, batch)[1]["rtd_loss"]

    def mlm(p):
        out = model.apply({"params": p}, batch, deterministic=False,
                          rngs={"dropout": jax.random.key(0)})
        return losses.compute_loss(cfg, out, batch)[1]["mlm_loss"]

    g = jax.grad(rtd)(params)
    gen = [np.abs(x).max() for k, v in g.items() if k.startswith("generator")
           for x in jax.tree.leaves(v)]
    assert gen and max(gen) == 0.0
    assert np.abs(g["encoder"]["layers"]["mlp"]["wi"]["kernel"]).max() > 0
    assert np.abs(g["rtd_logits"]["kernel"]).max() > 0
    assert np.abs(g["token_embedder"]["embedding"]).max() > 0  # shared: the discriminator's too
    g_mlm = jax.grad(mlm)(params)  # the generator learns from its own MLM loss
    assert np.abs(g_mlm["generator"]["layers"]["mlp"]["wi"]["kernel"]).max() > 0
    assert np.abs(g_mlm["encoder"]["layers"]["mlp"]["wi"]["kernel"]).max() == 0


def test_finetuning_uses_the_discriminator_only():
    cfg = _cfg()
    batch = synthetic_batch(cfg, np.random.default_rng(6))
    _, pre = _init(cfg, batch)
    cfg.model.num_classes = 2
    batch["class_labels"] = np.zeros((8,), np.int32)
    model, ft = _init(cfg, batch)
    assert set(ft) == {"token_embedder", "encoder", "class_dense"}
    jax.tree.map(lambda a, b: None if a.shape == b.shape else pytest.fail("shape"),
                 ft["encoder"], pre["encoder"])
    out = model.apply({"params": ft}, batch)
    assert set(out) == {"class_logits"} and out["class_logits"].shape == (8, 2)


# ----------------------------------------------------------------------------- Hugging Face


def _hf_electra(embedding_size, seed=0):
    cfg = transformers.ElectraConfig(
        vocab_size=F.VOCAB, embedding_size=embedding_size, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=48, max_position_embeddings=24,
        type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-12)
    torch.manual_seed(seed)
    model = transformers.ElectraForPreTraining(cfg)
    F.randomize_(model, seed)
    return model.eval()


@pytest.mark.parametrize("embedding_size", [16, 32])
def test_discriminator_logits_match_hf_and_round_trip_exactly(embedding_size, tmp_path):
    hf_model = _hf_electra(embedding_size)
    hf_dir = F.save_hf_model(hf_model, tmp_path / "hf")
    cfg, params = convert.hf_to_t5lite(hf_dir)
    m = cfg.model
    assert m.electra.rtd_head and not m.electra.generator_d_model and not m.pooler
    assert m.embed_dim == (0 if embedding_size == 32 else embedding_size)
    hf_batch, batch, mask = F.bert_batches(np.random.default_rng(7))
    for k in ("encoder_target_tokens", "encoder_loss_weights"):  # no masking: as given
        batch.pop(k)
    with torch.no_grad():
        ref = hf_model(**hf_batch).logits.numpy()
    ours = np.asarray(build_model(m).apply({"params": params}, batch)["rtd_logits"])
    real = mask.astype(bool)
    diff = float(np.abs(ours - ref)[real].max())
    assert diff <= F.PARITY_TOL, diff
    assert np.abs(ref).max() > 0.1  # the comparison is not of near-zero logits
    out = convert.t5lite_to_hf(cfg, params, str(tmp_path / "out"))
    back = transformers.ElectraForPreTraining.from_pretrained(out).eval()
    sa, sb = hf_model.state_dict(), back.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    cfg2, params2 = convert.hf_to_t5lite(out)
    assert cfg2.model == cfg.model
    jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_pretrained_electra_exports_its_discriminator(tmp_path):
    cfg = _cfg()
    cfg.model.vocab_size = 128
    batch = synthetic_batch(cfg, np.random.default_rng(8))
    model, params = _init(cfg, batch)
    out = convert.t5lite_to_hf(cfg, params, str(tmp_path / "hf"))
    with open(os.path.join(out, "config.json")) as f:
        hf_cfg = json.load(f)
    assert hf_cfg["architectures"] == ["ElectraForPreTraining"]
    assert (hf_cfg["embedding_size"], hf_cfg["hidden_size"]) == (16, 32)
    hf = transformers.ElectraForPreTraining.from_pretrained(out).eval()
    batch.pop("encoder_loss_weights")
    ours = np.asarray(model.apply({"params": params}, batch)["rtd_logits"])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(batch["encoder_input_tokens"], dtype=torch.long)).logits
    assert np.abs(ours - ref.numpy()).max() <= F.PARITY_TOL


# ----------------------------------------------------------------------------- training


def test_tiny_electra_training_loss_falls(tmp_path):
    cfg = _cfg()
    cfg.optim.learning_rate = 3e-3
    cfg.train.steps, cfg.train.eval_steps = 30, 0
    cfg.checkpoint.every_steps = 30
    wd = str(tmp_path / "run")
    trainer.train(cfg, wd, train_iter=tf_iterator(cfg, n=8))
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if '"split": "train"' in line
                or '"split":"train"' in line]
    first, last = rows[0], rows[-1]
    assert last["loss"] < 0.8 * first["loss"], (first["loss"], last["loss"])
    assert last["rtd_loss"] < first["rtd_loss"] and last["mlm_loss"] < first["mlm_loss"]
    assert "rtd_accuracy" in last and "replaced_fraction" in last
