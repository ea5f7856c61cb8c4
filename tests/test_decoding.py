"""Decoding: cached == uncached, beam(1) == greedy, T -> 0 sampling == greedy, EOS / max-length,
beam scores == teacher-forced log-likelihood, and parity with Hugging Face generate()."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache

import hf_fixtures as F
from t5lite import config as config_lib
from t5lite import convert
from t5lite.eval import decoding
from t5lite.models import build_model, dummy_batch

N_NEW = 7


def _tiny(architecture):
    m = config_lib.ModelConfig(
        architecture=architecture, vocab_size=48, d_model=32, num_heads=2, head_dim=8, d_ff=48,
        num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0, init_std=0.3,
        tie_embeddings=architecture != "encoder_decoder")
    if architecture != "encoder_decoder":  # GPT-style: learned positions, layernorm
        m = dataclasses.replace(m, position="learned", norm="layernorm", max_length=32,
                                use_bias=True)
    model = build_model(m)
    batch = dummy_batch(m, 1, {"inputs": 8, "targets": 8})
    params = nn.meta.unbox(model.init({"params": jax.random.key(1), "dropout": jax.random.key(2)},
                                      batch)["params"])
    return model, params


@pytest.fixture(scope="module")
def encdec():
    return _tiny("encoder_decoder")


@pytest.fixture(scope="module")
def decoder_only():
    return _tiny("decoder_only")


@pytest.fixture(scope="module")
def prefix_lm():
    return _tiny("prefix_lm")


def _inputs(rng, batch=3, length=9, vocab=48):
    """Right-padded token rows of different lengths (>= 3), ids in [2, vocab)."""
    lengths = np.array([length] + list(rng.integers(3, length, batch - 1)))
    tokens = rng.integers(2, vocab, (batch, length)) * (np.arange(length) < lengths[:, None])
    return tokens.astype(np.int32), lengths.astype(np.int32)


def _dcfg(**kw):
    return config_lib.DecodeConfig(max_length=N_NEW, **kw)


def _greedy_uncached(model, params, inputs, lengths, eos_id):
    """Argmax of repeated full forward passes (no cache), one token at a time."""
    enc_dec = model.cfg.architecture == "encoder_decoder"
    b = inputs.shape[0]
    fwd = jax.jit(lambda p, x: model.apply({"params": p}, x, deterministic=True)["logits"])
    if enc_dec:
        seq = np.zeros((b, N_NEW), np.int32)  # decoder inputs: 0, t1, t2, ...
        start = np.zeros(b, np.int32)
    else:
        seq = np.zeros((b, inputs.shape[1] + N_NEW), np.int32)
        seq[:, :inputs.shape[1]] = inputs
        start = lengths - 1
    out = np.zeros((b, N_NEW), np.int32)
    done = np.zeros(b, bool)
    for i in range(N_NEW):
        if enc_dec:
            batch = {"encoder_input_tokens": inputs, "decoder_input_tokens": seq}
        else:
            real = (np.arange(seq.shape[1])[None] < (lengths + i)[:, None]).astype(np.int32)
            batch = {"decoder_input_tokens": seq, "decoder_segment_ids": real}
            if model.cfg.architecture == "prefix_lm":  # the prompt attends bidirectionally
                batch["decoder_causal_attention"] = (
                    np.arange(seq.shape[1])[None] < lengths[:, None]).astype(np.int32)
        logits = np.asarray(fwd(params, batch))
        tok = logits[np.arange(b), start + i].argmax(-1)
        tok = np.where(done, 0, tok)
        out[:, i] = tok
        done |= tok == eos_id
        if enc_dec and i + 1 < N_NEW:
            seq[:, i + 1] = tok
        elif not enc_dec:
            seq[np.arange(b), lengths + i] = tok
    return out


@pytest.mark.parametrize("kind", ["encdec", "decoder_only", "prefix_lm"])
def test_cached_greedy_equals_uncached_argmax(kind, request):
    model, params = request.getfixturevalue(kind)
    inputs, lengths = _inputs(np.random.default_rng(0))
    eos = 1 if kind == "encdec" else 47
    got = decoding.generate(model, params, _dcfg(), inputs, lengths, eos_id=eos)["tokens"]
    want = _greedy_uncached(model, params, inputs, lengths, eos)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 3, "degenerate model: the comparison would be weak"


@pytest.mark.parametrize("kind", ["encdec", "decoder_only"])
def test_one_beam_and_cold_sampling_equal_greedy(kind, request):
    model, params = request.getfixturevalue(kind)
    inputs, lengths = _inputs(np.random.default_rng(1))
    greedy = decoding.generate(model, params, _dcfg(), inputs, lengths)
    beam1 = decoding.generate(model, params, _dcfg(method="beam", beams=1, alpha=0.0), inputs,
                              lengths)
    cold = decoding.generate(model, params, _dcfg(method="sample", temperature=1e-4), inputs,
                             lengths)
    np.testing.assert_array_equal(beam1["tokens"], greedy["tokens"])
    np.testing.assert_allclose(beam1["scores"], greedy["scores"], rtol=1e-5)
    np.testing.assert_array_equal(cold["tokens"], greedy["tokens"])
    hot = decoding.generate(model, params, _dcfg(method="sample", temperature=3.0), inputs,
                            lengths)
    assert (hot["tokens"] != greedy["tokens"]).any()


def test_top_k_and_top_p_restrict_the_support(encdec):
    model, params = encdec
    inputs, lengths = _inputs(np.random.default_rng(2))
    greedy = decoding.generate(model, params, _dcfg(), inputs, lengths)["tokens"]
    for kw in (dict(top_k=1), dict(top_p=1e-6)):  # only the argmax survives the filter
        got = decoding.generate(model, params, _dcfg(method="sample", temperature=5.0, **kw),
                                inputs, lengths)["tokens"]
        np.testing.assert_array_equal(got, greedy)
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    kept = np.asarray(decoding._filter_logits(logits, 0, 0.7)) > decoding.NEG / 2
    np.testing.assert_array_equal(kept, [[True, True, False, False]])
    kept = np.asarray(decoding._filter_logits(logits, 3, 1.0)) > decoding.NEG / 2
    np.testing.assert_array_equal(kept, [[True, True, True, False]])


def test_eos_stops_and_pads_and_max_length_caps(decoder_only):
    model, params = decoder_only
    inputs, lengths = _inputs(np.random.default_rng(3))
    free = decoding.generate(model, params, _dcfg(), inputs, lengths, eos_id=0)["tokens"]
    eos = int(free[0, 2])  # make row 0's third token the EOS
    assert eos not in free[0, :2]
    got = decoding.generate(model, params, _dcfg(), inputs, lengths, eos_id=eos)["tokens"]
    assert got.shape == (3, N_NEW)
    np.testing.assert_array_equal(got[0, :3], free[0, :3])
    assert (got[0, 3:] == 0).all()
    for row in range(3):  # every row equals the free run up to its first EOS, then zeros
        hits = np.flatnonzero(free[row] == eos)
        stop = hits[0] + 1 if len(hits) else N_NEW
        np.testing.assert_array_equal(got[row, :stop], free[row, :stop])
        assert (got[row, stop:] == 0).all()
    short = decoding.generate(model, params, dataclasses.replace(_dcfg(), max_length=2), inputs,
                              lengths, eos_id=eos)["tokens"]
    np.testing.assert_array_equal(short, free[:, :2])


def test_beam_scores_are_length_normalised_log_likelihoods(encdec):
    """Cache reordering check: every returned beam's score equals its teacher-forced
    log-likelihood / ((5 + len) / 6) ** alpha; beams are distinct and sorted."""
    model, params = encdec
    inputs, _ = _inputs(np.random.default_rng(4))
    alpha, eos = 0.6, 1
    out = decoding.generate(model, params, _dcfg(method="beam", beams=3, alpha=alpha), inputs,
                            eos_id=eos)
    beams, scores = out["beams"], out["beam_scores"]
    b, nb, n = beams.shape
    assert (np.diff(scores, axis=1) <= 1e-6).all()
    score_fn = decoding.make_score_fn(model)
    targets = beams.reshape(b * nb, n)
    dec_in = np.concatenate([np.zeros((b * nb, 1), np.int32), targets[:, :-1]], 1)
    lens = np.array([np.flatnonzero(t == eos)[0] + 1 if (t == eos).any() else n
                     for t in targets])
    weights = (np.arange(n)[None] < lens[:, None]).astype(np.int32)
    ll = np.asarray(score_fn(params, {
        "encoder_input_tokens": np.repeat(inputs, nb, 0), "decoder_input_tokens": dec_in,
        "decoder_target_tokens": targets, "decoder_loss_weights": weights}))
    want = ll / np.asarray(decoding.length_penalty(lens, alpha))
    np.testing.assert_allclose(scores.reshape(-1), want, rtol=1e-4, atol=1e-4)
    for row in beams:
        assert len({tuple(r) for r in row}) == nb


# ----------------------------------------------------------------------------- Hugging Face


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    out = {}
    for kind in ("t5_v1_1", "gpt2"):
        hf = F.make_hf_model(kind, seed=5)
        path = F.save_hf_model(hf, tmp_path_factory.mktemp(kind))
        cfg, params = convert.hf_to_t5lite(path)
        out[kind] = (hf, build_model(cfg.model), jax.tree.map(jnp.asarray, params))
    return out


def _hf_generate(hf, **kw):
    with torch.no_grad():
        return hf.generate(do_sample=False, max_new_tokens=N_NEW, min_new_tokens=0, **kw).numpy()


def _strip_hf(seq, eos, pad):
    """HF rows after EOS hold `pad`; ours hold 0. -> ours' layout, length N_NEW."""
    out = np.zeros(N_NEW, np.int32)
    for i, t in enumerate(seq[:N_NEW]):
        out[i] = t
        if t == eos:
            break
    del pad
    return out


@pytest.mark.parametrize("beams", [1, 3])
def test_t5_matches_hf_generate(beams, hf_models):
    hf, model, params = hf_models["t5_v1_1"]
    inputs, _ = _inputs(np.random.default_rng(6), batch=4, length=10, vocab=F.VOCAB)
    mask = (inputs != 0).astype(np.int64)
    # A cache built lazily: transformers 5.23 sizes T5's default one by the encoder's depth.
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    ref = _hf_generate(hf, input_ids=torch.tensor(inputs, dtype=torch.long),
                       attention_mask=torch.tensor(mask), num_beams=beams, length_penalty=0.0,
                       early_stopping=False, past_key_values=cache)[:, 1:]  # drop start token
    dcfg = _dcfg(method="beam" if beams > 1 else "greedy", beams=beams, alpha=0.0)
    got = decoding.generate(model, params, dcfg, inputs, eos_id=1)["tokens"]
    want = np.stack([_strip_hf(r, 1, 0) for r in ref])
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 4


@pytest.mark.parametrize("beams", [1, 3])
def test_gpt2_prompts_of_different_lengths_match_hf(beams, hf_models):
    hf, model, params = hf_models["gpt2"]
    eos = F.VOCAB - 1
    prompts, lengths = _inputs(np.random.default_rng(7), batch=3, length=8, vocab=F.VOCAB - 1)
    dcfg = _dcfg(method="beam" if beams > 1 else "greedy", beams=beams, alpha=0.0)
    got = decoding.generate(model, params, dcfg, prompts, lengths, eos_id=eos)["tokens"]
    for row in range(3):  # HF reference: one unpadded prompt at a time
        p = prompts[row, :lengths[row]][None]
        ref = _hf_generate(hf, input_ids=torch.tensor(p, dtype=torch.long),
                           attention_mask=torch.ones_like(torch.tensor(p)), num_beams=beams,
                           length_penalty=0.0, early_stopping=False,
                           pad_token_id=eos)[0, lengths[row]:]
        np.testing.assert_array_equal(got[row], _strip_hf(ref, eos, eos))


# ----------------------------------------------------------------------------- self-consistency


def test_majority_vote_picks_the_mode_and_breaks_ties_by_summed_score():
    rng = np.random.default_rng(0)
    answers = list(rng.choice(["a", "b", "c"], size=201, p=[0.2, 0.5, 0.3]))
    scores = rng.normal(size=201)
    i = decoding.majority_vote(answers, scores)
    assert answers[i] == "b"
    assert scores[i] == max(s for a, s in zip(answers, scores) if a == "b")
    # 2 vs 2: "y" has the higher summed log-likelihood (-1.5 > -2.5) though "x" has the best
    # single sample
    assert decoding.majority_vote(["x", "y", "x", "y"], [-0.1, -0.7, -2.4, -0.8]) == 1
    assert decoding.majority_vote(["x", "y", "x", "z"], [-9, 0, -9, 0]) == 0  # count first


@pytest.mark.parametrize("kind", ["encdec", "decoder_only"])
def test_self_consistency_with_one_sample_equals_sampling(kind, request):
    model, params = request.getfixturevalue(kind)
    inputs, lengths = _inputs(np.random.default_rng(4))
    key = jax.random.key(7)
    plain = decoding.generate(model, params, _dcfg(method="sample", temperature=1.5), inputs,
                              lengths, key=key)
    sc = decoding.generate(model, params, _dcfg(method="self_consistency", num_samples=1,
                                                temperature=1.5), inputs, lengths, key=key)
    np.testing.assert_array_equal(sc["tokens"], plain["tokens"])
    np.testing.assert_allclose(sc["scores"], plain["scores"], rtol=1e-6)
    assert (sc["votes"] == 1).all() and sc["samples"].shape == (3, 1, N_NEW)


def test_self_consistency_votes_for_the_mode_of_the_model_distribution(decoder_only):
    """One new token per sample; its answer names whether it lies in a set S of tokens with
    P(S) ~ 0.7 under the model's own next-token distribution: the vote must pick S's name
    (whichever it is), a token in S, with a vote share near P(S)."""
    model, params = decoder_only
    inputs = np.random.default_rng(5).integers(2, 48, (2, 6)).astype(np.int32)
    logits = model.apply({"params": params}, {"decoder_input_tokens": inputs})["logits"]
    probs = np.asarray(jax.nn.softmax(logits[:, -1]), np.float64)  # [2, V]
    n = 128
    dcfg = config_lib.DecodeConfig(method="self_consistency", num_samples=n, max_length=1,
                                   temperature=1.0)
    for row in range(2):
        order = [t for t in np.argsort(-probs[row]) if t > 1]  # 0 = pad, 1 = EOS: never in S
        mass = np.cumsum(probs[row][order])
        S = set(int(t) for t in order[:int(np.searchsorted(mass, 0.7)) + 1])
        p_s = probs[row][sorted(S)].sum()
        assert 0.65 <= p_s <= 0.85
        for label_s, label_rest in (("in", "out"), ("out", "in")):  # the mode, either name
            def answer(ids, label_s=label_s, label_rest=label_rest):
                return label_s if ids and ids[0] in S else label_rest
            out = decoding.generate(model, params, dcfg, inputs[row:row + 1], eos_id=1,
                                    key=jax.random.key(row), answer_fn=answer)
            assert out["answers"] == [label_s]
            assert int(out["tokens"][0, 0]) in S
            assert abs(out["votes"][0] / n - p_s) < 0.12


def test_predictor_programs_take_the_meshs_compiler_options(encdec, monkeypatch):
    """Decoding and scoring on a mesh compile with partitioning.compiler_options (on a TPU:
    the train step's asynchronous collectives): an option no XLA knows is refused by both."""
    from t5lite.eval import evaluation
    from t5lite.mesh import partitioning
    model, params = encdec
    cfg = config_lib.Config(model=model.cfg)
    cfg.data.feature_lengths = {"inputs": 8, "targets": 8}
    cfg.eval.batch_size, cfg.decode.max_length = 2, 4
    mesh = partitioning.make_mesh(cfg.mesh, jax.devices()[:1])
    assert partitioning.compiler_options(cfg, None) == {}  # no mesh: none
    assert evaluation.Predictor(cfg, model, params, eos_id=1).predict([[3, 4, 5]])
    monkeypatch.setattr(partitioning, "compiler_options",
                        lambda c, m: {"xla_t5lite_no_such_option": True})
    pred = evaluation.Predictor(cfg, model, params, eos_id=1, mesh=mesh)
    with pytest.raises(Exception, match="xla_t5lite_no_such_option"):
        pred.predict([[3, 4, 5]])
    with pytest.raises(Exception, match="xla_t5lite_no_such_option"):
        pred.score([[3, 4, 5]], [[6, 1]])
