"""Batched autoregressive decoding with the model's KV cache: greedy, beam search, sampling,
self-consistency (sampling N answers per input and a majority vote over their final answers).

One jit-compiled program per (model, DecodeConfig, shapes): a prefill call writes the prompt
into the cache, then a ``lax.while_loop`` feeds one token per step until every sequence has
emitted EOS or ``max_length`` new tokens exist. Finished sequences are padded with 0 after EOS.

Both model kinds decode from a prompt held in the decoder cache:
  * encoder_decoder: the prompt is the decoder start token 0 (length 1); the encoder runs once.
  * decoder_only / prefix_lm: the prompt is right-padded ``prompt_BP`` with per-row lengths.
    Cache slots past a row's length carry segment id 0, so they are masked out, and row b's
    new tokens sit at positions len_b, len_b + 1, ... (the cache write index is shared).

Beam search follows Hugging Face / fairseq: 2N candidates per step; an EOS candidate becomes a
finished hypothesis only if it ranks among the top N; at the last step the top N finish;
finished scores are log p / lp(len) with the GNMT / T5 penalty lp = ((5 + len) / 6) ** alpha
(alpha = 0: plain log-likelihood, which is HF's ``length_penalty=0``). The search stops early
once no live beam can beat the worst kept hypothesis of every example.

Ensembles (the T5 paper's Table 13): ``ensemble(params_list)`` stacks several models of one
architecture on a leading member axis; every prefill and step then runs each member (vmap) and
feeds the search the mean of their logits, so the members share one token history. Greedy,
sampling and self-consistency; not beam search (its cache reordering assumes one model).

Self-consistency (Wang et al. 2022): every input row is repeated N = decode.num_samples times
and sampled as method="sample" does (same temperature / top-k / top-p, same key: N = 1 gives
exactly the plain sample). On the host each sample is mapped to its final answer by
``answer_fn`` (the task's postprocessor on the decoded text; default: the ids before EOS, i.e.
identity on the text); the most frequent answer wins. Ties go to the answer whose samples have
the highest summed log-likelihood; the returned tokens are that answer's best-scoring sample.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.errors import UserError

NEG = -1.0e9  # "impossible" score: finite, so arithmetic on it never makes NaNs


def check(dcfg, model_cfg=None, prompt_length: int = 1) -> None:
    """Config errors with what to do about them (single fields: config.check_fields)."""
    from t5lite import config as config_lib
    config_lib.check_fields(dcfg, "decode")
    if model_cfg is None:
        return
    if model_cfg.architecture == "encoder_only":
        raise UserError("encoder_only models (BERT) do not generate; evaluate them with their "
                        "classification head, or use a T5 / GPT checkpoint.")
    if model_cfg.position == "learned" and prompt_length + dcfg.max_length > model_cfg.max_length:
        raise UserError(
            f"prompt ({prompt_length}) + decode.max_length ({dcfg.max_length}) tokens exceed "
            f"the model's {model_cfg.max_length} learned positions; lower decode.max_length "
            "or shorten the inputs.")


def length_penalty(length, alpha: float):
    """GNMT / T5 brevity penalty ((5 + len) / 6) ** alpha."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


# ----------------------------------------------------------------------------- cache plumbing


def _map_batch(fn, cache):
    """Apply fn(x, batch_axis) to every batched cache leaf. Scanned layers ("layers") stack a
    leading layer axis, so their batch axis is 1; write indices have no batch axis."""
    def f(path, x):
        names = [getattr(k, "key", None) for k in path]
        if names[-1] == "index":
            return x
        return fn(x, 1 if "layers" in names else 0)
    return jax.tree_util.tree_map_with_path(f, cache)


def _take_rows(cache, rows):
    return _map_batch(lambda x, axis: jnp.take(x, rows, axis=axis), cache)


class _Stepper:
    """The model's prefill and one-token calls over the cache."""

    def __init__(self, model, params, encoded=None, encoder_tokens=None):
        self.model, self.params = model, params
        self.encoded, self.encoder_tokens = encoded, encoder_tokens
        self.prefix_lm = model.cfg.architecture == "prefix_lm"

    def __call__(self, cache, tokens_BT, positions_BT, segments_BT, bidirectional_BT=None):
        kwargs = {}
        if self.prefix_lm and bidirectional_BT is not None:
            kwargs["decoder_causal_attention"] = bidirectional_BT
        logits_BTV, vars_ = self.model.apply(
            {"params": self.params, "cache": cache}, tokens_BT, encoded=self.encoded,
            encoder_input_tokens=self.encoder_tokens, decoder_positions=positions_BT,
            decoder_segment_ids=segments_BT, decode=True, mutable=["cache"], method="decode",
            **kwargs)
        return logits_BTV, vars_["cache"]

    def repeat(self, n: int) -> "_Stepper":
        """The same stepper for a batch with every row repeated n times (beams)."""
        rep = lambda x: None if x is None else jnp.repeat(x, n, axis=0)  # noqa: E731
        return _Stepper(self.model, self.params, rep(self.encoded), rep(self.encoder_tokens))


@flax.struct.dataclass
class Ensemble:
    """Several models' params of one architecture stacked on a leading member axis (M):
    decoding and scoring use the mean of the members' logits."""

    params_M: Any

    @property
    def size(self) -> int:
        return jax.tree.leaves(self.params_M)[0].shape[0]


def ensemble(params_list) -> Ensemble:
    """Stack the params of models with one architecture (equal trees and shapes)."""
    params_list = list(params_list)
    shapes = [jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), p) for p in params_list]
    if not params_list or any(s != shapes[0] for s in shapes):
        raise UserError("an ensemble needs one or more models of the same architecture and "
                        "sizes (equal parameter trees); check the members' model.* configs.")
    return Ensemble(jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]),
                                 *params_list))


class _EnsembleStepper:
    """_Stepper over an Ensemble: each member steps its own cache (stacked on axis 0); the
    search sees the mean of their logits."""

    def __init__(self, model, params_M, encoded_M, encoder_tokens):
        self.model, self.params_M, self.encoded_M = model, params_M, encoded_M
        self.encoder_tokens = encoder_tokens

    def __call__(self, cache_M, tokens_BT, positions_BT, segments_BT, bidirectional_BT=None):
        def member(params, encoded, cache):
            stepper = _Stepper(self.model, params, encoded, self.encoder_tokens)
            return stepper(cache, tokens_BT, positions_BT, segments_BT, bidirectional_BT)
        logits_MBTV, cache_M = jax.vmap(member)(self.params_M, self.encoded_M, cache_M)
        return jnp.mean(logits_MBTV.astype(jnp.float32), axis=0), cache_M


def _prefill_ensemble(model, ens: Ensemble, encoder_input_tokens, prompt_BP, lengths_B,
                      cache_length):
    """_prefill for every member; -> (stepper, stacked caches, mean logits_BV)."""
    def member(params):
        stepper, cache, logits_BV = _prefill(model, params, encoder_input_tokens, prompt_BP,
                                             lengths_B, cache_length)
        return stepper.encoded, cache, logits_BV
    encoded_M, cache_M, logits_MBV = jax.vmap(member)(ens.params_M)
    stepper = _EnsembleStepper(model, ens.params_M, encoded_M,
                               encoder_input_tokens if encoded_M is not None else None)
    return stepper, cache_M, jnp.mean(logits_MBV.astype(jnp.float32), axis=0)


def _prefill(model, params, encoder_input_tokens, prompt_BP, lengths_B, cache_length):
    """Encode (enc-dec), write the prompt into a fresh cache. -> (stepper, cache, logits_BV)
    where logits_BV predict each row's first new token."""
    from t5lite.models import init_cache
    encoded = None
    if model.cfg.architecture == "encoder_decoder":
        encoded = model.apply({"params": params}, encoder_input_tokens, method="encode")
    b, p = prompt_BP.shape
    stepper = _Stepper(model, params, encoded,
                       encoder_input_tokens if encoded is not None else None)
    cache = init_cache(model, params, b, cache_length, encoder_input_tokens)
    positions_BP = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    valid_BP = (positions_BP < lengths_B[:, None]).astype(jnp.int32)
    logits_BPV, cache = stepper(cache, prompt_BP, positions_BP, valid_BP, valid_BP)
    last_B = jnp.maximum(lengths_B - 1, 0)
    logits_BV = jnp.take_along_axis(logits_BPV, last_B[:, None, None], axis=1)[:, 0]
    return stepper, cache, logits_BV


# ----------------------------------------------------------------------------- token choice


def _filter_logits(logits_BV, top_k, top_p):
    """Keep the top_k tokens (0 = all) and the smallest set with probability mass >= top_p.
    top_k / top_p may be traced values: one compiled program serves every setting."""
    v = logits_BV.shape[-1]
    sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
    kth_B1 = jnp.take(sorted_BV, jnp.clip(top_k - 1, 0, v - 1), axis=-1)[:, None]
    kth_B1 = jnp.where(top_k > 0, kth_B1, -jnp.inf)
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    keep_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV < top_p  # always keeps the argmax
    nucleus_B1 = jnp.min(jnp.where(keep_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits_BV < jnp.maximum(kth_B1, nucleus_B1), NEG, logits_BV)


def _choose(knobs, logits_BV, key):
    """Sample at knobs["temperature"] (0 = argmax) after top-k / top-p filtering."""
    t = knobs["temperature"]
    scaled_BV = _filter_logits(logits_BV / jnp.maximum(t, 1e-30), knobs["top_k"], knobs["top_p"])
    sampled_B = jax.random.categorical(key, scaled_BV, axis=-1)
    return jnp.where(t > 0, sampled_B, jnp.argmax(logits_BV, axis=-1)).astype(jnp.int32)


# ----------------------------------------------------------------------------- search loops


def _sample_loop(n, knobs, stepper, cache, logits_BV, lengths_B, eos_id, key):
    """Greedy or sampling. -> (tokens_BL, log-likelihood_B of the chosen tokens)."""
    b = logits_BV.shape[0]

    def cond(c):
        i, _, _, _, done_B, _ = c
        return (i < n) & ~jnp.all(done_B)

    def body(c):
        i, logits_BV, cache, tokens_BL, done_B, score_B = c
        tok_B = _choose(knobs, logits_BV, jax.random.fold_in(key, i))
        logp_B = jnp.take_along_axis(jax.nn.log_softmax(logits_BV), tok_B[:, None], 1)[:, 0]
        tok_B = jnp.where(done_B, 0, tok_B)
        score_B = score_B + jnp.where(done_B, 0.0, logp_B)
        tokens_BL = jax.lax.dynamic_update_slice(tokens_BL, tok_B[:, None], (0, i))
        done_B = done_B | (tok_B == eos_id)
        logits_B1V, cache = stepper(cache, tok_B[:, None], (lengths_B + i)[:, None],
                                    jnp.ones((b, 1), jnp.int32))
        return i + 1, logits_B1V[:, 0], cache, tokens_BL, done_B, score_B

    init = (jnp.int32(0), logits_BV, cache, jnp.zeros((b, n), jnp.int32),
            jnp.zeros((b,), bool), jnp.zeros((b,), jnp.float32))
    _, _, _, tokens_BL, _, score_B = jax.lax.while_loop(cond, body, init)
    return tokens_BL, score_B


def _gather(x_BK, idx_BJ):
    """x[b, idx[b, j]] for [B, K, ...] arrays."""
    return jax.vmap(lambda x, i: x[i])(x_BK, idx_BJ)


def _beam_loop(n, nb, alpha, stepper, cache, logits_BV, lengths_B, eos_id):
    """Beam search. -> (best tokens_BL, its score_B, all beams_BNL, their scores_BN)."""
    b, v = logits_BV.shape
    flat = lambda x: x.reshape((b * nb,) + x.shape[2:])  # noqa: E731
    rows_BN = jnp.repeat(jnp.arange(b), nb).reshape(b, nb)
    cache = _take_rows(cache, rows_BN.reshape(-1))
    logits_NV = jnp.repeat(logits_BV, nb, axis=0)
    lengths_N = jnp.repeat(lengths_B, nb)
    stepper = stepper.repeat(nb)
    # All beams start identical: only the first one may expand at step 0.
    live_lp_BN = jnp.where(jnp.arange(nb) == 0, 0.0, NEG)[None].repeat(b, 0)
    zeros = jnp.zeros((b, nb, n), jnp.int32)
    fin_BN = jnp.full((b, nb), NEG, jnp.float32)
    best_final = length_penalty(n, alpha)  # alpha >= 0: no live beam can score above lp / this

    def cond(c):
        i, _, _, live_lp_BN, _, _, fin_BN, _ = c
        worst_kept_B = jnp.min(fin_BN, axis=1)
        can_improve_B = live_lp_BN[:, 0] / best_final > worst_kept_B
        return (i < n) & jnp.any(can_improve_B)

    def body(c):
        i, logits_NV, cache, live_lp_BN, live_BNL, fin_BNL, fin_BN, fin_flag_BN = c
        logp_BNV = jax.nn.log_softmax(logits_NV).reshape(b, nb, v)
        cand_BC = (live_lp_BN[:, :, None] + logp_BNV).reshape(b, nb * v)
        top_lp_BK, top_idx_BK = jax.lax.top_k(cand_BC, 2 * nb)
        src_BK, tok_BK = top_idx_BK // v, (top_idx_BK % v).astype(jnp.int32)
        seqs_BKL = jax.lax.dynamic_update_slice(_gather(live_BNL, src_BK),
                                                tok_BK[:, :, None], (0, 0, i))
        is_eos_BK = tok_BK == eos_id
        # Live: the best N candidates that did not end.
        live_lp_BN, pick_BN = jax.lax.top_k(jnp.where(is_eos_BK, NEG, top_lp_BK), nb)
        live_BNL = _gather(seqs_BKL, pick_BN)
        new_tok_BN, src_BN = _gather(tok_BK, pick_BN), _gather(src_BK, pick_BN)
        # Finished: EOS among the top N candidates, or everything at the last step.
        ends_BK = (is_eos_BK | (i == n - 1)) & (jnp.arange(2 * nb) < nb)[None]
        cand_fin_BK = jnp.where(ends_BK, top_lp_BK / length_penalty(i + 1, alpha), NEG)
        fin_BN, keep_BN = jax.lax.top_k(jnp.concatenate([fin_BN, cand_fin_BK], 1), nb)
        fin_BNL = _gather(jnp.concatenate([fin_BNL, seqs_BKL], 1), keep_BN)
        fin_flag_BN = _gather(jnp.concatenate([fin_flag_BN, ends_BK], 1), keep_BN)
        # Reorder the cache to the surviving beams, then feed their new tokens.
        cache = _take_rows(cache, (rows_BN * nb + src_BN).reshape(-1))
        logits_N1V, cache = stepper(cache, flat(new_tok_BN)[:, None], (lengths_N + i)[:, None],
                                    jnp.ones((b * nb, 1), jnp.int32))
        return (i + 1, logits_N1V[:, 0], cache, live_lp_BN, live_BNL, fin_BNL, fin_BN,
                fin_flag_BN)

    init = (jnp.int32(0), logits_NV, cache, live_lp_BN, zeros, zeros, fin_BN,
            jnp.zeros((b, nb), bool))
    out = jax.lax.while_loop(cond, body, init)
    fin_BNL, fin_BN = out[5], out[6]
    return fin_BNL[:, 0], fin_BN[:, 0], fin_BNL, fin_BN


# ----------------------------------------------------------------------------- entry points


_FNS: dict = {}


def runtime_knobs(dcfg) -> dict:
    """The decoding settings that are runtime values (no recompile when they change)."""
    greedy = dcfg.method == "greedy"
    return {"temperature": np.float32(0.0 if greedy else dcfg.temperature),
            "top_k": np.int32(dcfg.top_k), "top_p": np.float32(dcfg.top_p),
            "alpha": np.float32(dcfg.alpha)}


def make_generate_fn(model, dcfg, eos_id: int, compiler_options=None):
    """-> fn(params, inputs_BS, lengths_B, key, answer_fn=None) -> {"tokens" [B, max_length],
    "scores" [B]} (+ "beams" [B, N, max_length], "beam_scores" [B, N] for beam search; for
    self_consistency numpy outputs plus "samples" [B, N, max_length], "sample_scores" [B, N],
    "answers" (the winning answer per row) and "votes" [B] (its count), see vote()).

    inputs_BS: encoder_input_tokens (enc-dec; lengths unused) or the right-padded decoder
    prompt (decoder_only / prefix_lm) with lengths_B >= 1 real tokens per row. Greedy and all
    sampling settings (and EOS ids) share one compiled program; beam search one per beam
    count, self-consistency one per sample count. answer_fn (self_consistency only) maps a
    sample's ids before EOS to its final answer (hashable).
    """
    check(dcfg, model.cfg)
    beams = dcfg.beams if dcfg.method == "beam" else 0
    samples = dcfg.num_samples if dcfg.method == "self_consistency" else 0
    options = compiler_options or {}  # the mesh's (partitioning.compiler_options)
    sig = (repr(model.cfg), beams, samples, dcfg.max_length, tuple(sorted(options.items())))
    if sig not in _FNS:
        _FNS[sig] = jax.jit(functools.partial(generate_program, model, beams, samples,
                                              dcfg.max_length), compiler_options=options)
    jitted, knobs = _FNS[sig], dict(runtime_knobs(dcfg), eos_id=np.int32(eos_id))
    if not samples:
        return lambda params, inputs_BS, lengths_B, key, answer_fn=None: jitted(
            params, inputs_BS, lengths_B, key, knobs)

    def self_consistent(params, inputs_BS, lengths_B, key, answer_fn=None):
        out = jax.device_get(jitted(params, inputs_BS, lengths_B, key, knobs))
        return vote(out["samples"], out["sample_scores"], eos_id, answer_fn)
    return self_consistent


def generate_program(model, beams, samples, n, params, inputs_BS, lengths_B, key, knobs):
    """The traceable decoding program make_generate_fn jits (tpu.compile.compile_decode lowers
    it for a TPU slice): ``beams`` / ``samples`` / ``n`` (max length) are static, ``knobs``
    runtime."""
    b, eos_id = inputs_BS.shape[0], knobs["eos_id"]
    if samples:  # self-consistency: every row N times (row-major), sampled independently
        inputs_BS = jnp.repeat(inputs_BS, samples, axis=0)
        lengths_B = jnp.repeat(lengths_B, samples, axis=0)
        out = generate_program(model, 0, 0, n, params, inputs_BS, lengths_B, key, knobs)
        return {"samples": out["tokens"].reshape(b, samples, n),
                "sample_scores": out["scores"].reshape(b, samples)}
    if model.cfg.architecture == "encoder_decoder":
        prompt_BP, lengths_B = jnp.zeros((b, 1), jnp.int32), jnp.ones((b,), jnp.int32)
        encoder_tokens = inputs_BS
    else:
        prompt_BP, encoder_tokens = inputs_BS, None
    prefill = _prefill_ensemble if isinstance(params, Ensemble) else _prefill
    if beams and isinstance(params, Ensemble):
        raise UserError("an ensemble decodes greedily or by sampling; set decode.method=greedy")
    stepper, cache, logits_BV = prefill(model, params, encoder_tokens, prompt_BP,
                                        lengths_B.astype(jnp.int32), prompt_BP.shape[1] + n)
    if beams:
        tokens_BL, score_B, beams_BNL, beam_scores_BN = _beam_loop(
            n, beams, knobs["alpha"], stepper, cache, logits_BV, lengths_B, eos_id)
        return {"tokens": tokens_BL, "scores": score_B, "beams": beams_BNL,
                "beam_scores": beam_scores_BN}
    tokens_BL, score_B = _sample_loop(n, knobs, stepper, cache, logits_BV, lengths_B, eos_id,
                                      key)
    return {"tokens": tokens_BL, "scores": score_B}


def strip_eos(row, eos_id: int) -> tuple:
    """The ids before the first EOS (padding 0s dropped)."""
    row = [int(t) for t in row]
    return tuple(row[:row.index(eos_id)] if eos_id in row else [t for t in row if t])


def majority_vote(answers, scores) -> int:
    """Index of the sample carrying the most frequent answer. Ties: the answer whose samples
    have the highest summed score (log-likelihood); within it, its best-scoring sample."""
    count, total = {}, {}
    for a, s in zip(answers, scores):
        count[a] = count.get(a, 0) + 1
        total[a] = total.get(a, 0.0) + float(s)
    best = max(count, key=lambda a: (count[a], total[a]))
    return max((i for i, a in enumerate(answers) if a == best), key=lambda i: float(scores[i]))


def _hashable(x):
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


def vote(samples_BNL, scores_BN, eos_id: int, answer_fn=None) -> dict:
    """Self-consistency on the host: per row, map each sample to answer_fn(ids before EOS)
    (default: those ids) and keep the majority_vote winner."""
    samples_BNL, scores_BN = np.asarray(samples_BNL), np.asarray(scores_BN)
    answer_fn = answer_fn or (lambda ids: ids)
    rows, answers, votes = [], [], []
    for b in range(samples_BNL.shape[0]):
        ans = [_hashable(answer_fn(strip_eos(s, eos_id))) for s in samples_BNL[b]]
        i = majority_vote(ans, scores_BN[b])
        rows.append(i)
        answers.append(ans[i])
        votes.append(sum(a == ans[i] for a in ans))
    idx = np.arange(samples_BNL.shape[0])
    return {"tokens": samples_BNL[idx, rows], "scores": scores_BN[idx, rows],
            "samples": samples_BNL, "sample_scores": scores_BN, "answers": answers,
            "votes": np.asarray(votes, np.int32)}


def generate(model, params, dcfg, inputs_BS, lengths_B=None, eos_id: int = 1, key=None,
             answer_fn=None):
    """Decode one batch of numpy inputs (see make_generate_fn) -> numpy outputs.
    lengths_B default: up to each row's last nonzero token."""
    inputs_BS = np.asarray(inputs_BS, np.int32)
    if lengths_B is None:
        nonzero = inputs_BS != 0
        lengths_B = np.where(nonzero.any(1), inputs_BS.shape[1] - np.argmax(nonzero[:, ::-1], 1),
                             0)
    if model.cfg.architecture != "encoder_decoder" and np.min(lengths_B) < 1:
        raise UserError("every decoder-only prompt needs at least one token (e.g. a BOS id).")
    check(dcfg, model.cfg, inputs_BS.shape[1] if model.cfg.architecture != "encoder_decoder"
          else 1)
    key = jax.random.key(dcfg.seed) if key is None else key
    fn = make_generate_fn(model, dcfg, eos_id)
    return jax.device_get(fn(params, inputs_BS, np.asarray(lengths_B, np.int32), key,
                             answer_fn))


# ----------------------------------------------------------------------------- scoring


def make_score_fn(model, compiler_options=None):
    """-> jit fn(params, batch) -> [B] sum of log p(target token) over decoder_loss_weights
    (teacher forcing: the log-likelihood of given targets, for score / rank evaluation)."""
    def logits(params, batch):
        return model.apply({"params": params}, batch,
                           deterministic=True)["logits"].astype(jnp.float32)

    def score(params, batch):
        if isinstance(params, Ensemble):  # the members' mean logits, as in decoding
            logits_BLV = jnp.mean(jax.vmap(logits, in_axes=(0, None))(params.params_M, batch),
                                  axis=0)
        else:
            logits_BLV = logits(params, batch)
        logp_BLV = jax.nn.log_softmax(logits_BLV)
        tgt_BL = batch["decoder_target_tokens"]
        ll_BL = jnp.take_along_axis(logp_BLV, tgt_BL[..., None], axis=-1)[..., 0]
        weights_BL = batch.get("decoder_loss_weights", (tgt_BL != 0).astype(jnp.int32))
        return jnp.sum(ll_BL * weights_BL, axis=1)
    return jax.jit(score, compiler_options=compiler_options)
