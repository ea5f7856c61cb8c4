"""Narang et al. 2021's Transformer modifications (issue 38): the table (every row a config that
validates at every scale, rendered beside the paper's numbers) and the defining behaviour of
the activation, normalization, depth, embedding and sharing rows' model fields."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from t5lite import ablations
from t5lite.ablations import modifications
from t5lite.ablations.plan import default_tasks, plan_row
from t5lite.config import ModelConfig
from t5lite.errors import UserError
from t5lite.models import build_model, count_params, dummy_batch, layerwise_counts
from t5lite.models import layers as L
from numerics import assert_close_at_scale

KEY = functools.partial(jax.random.key, impl="rbg")
LENGTHS = {"inputs": 10, "targets": 8}


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                num_encoder_layers=3, num_decoder_layers=2, dropout_rate=0.0, max_length=32,
                norm="layernorm")
    return ModelConfig(**{**base, **kw})


def init(cfg):
    model = build_model(cfg)
    batch = dummy_batch(cfg, 2, LENGTHS)
    batch["encoder_input_tokens"] = jax.random.randint(KEY(3), (2, 10), 1, cfg.vocab_size)
    params = nn.meta.unbox(jax.jit(functools.partial(model.init, deterministic=True))(
        {"params": KEY(0)}, batch)["params"])
    return model, params, batch


def encode(model, params, batch):
    return model.apply({"params": params}, batch["encoder_input_tokens"],
                       method=lambda m, t: m.encode(t))


# ----------------------------------------------------------------------------- activations

@pytest.mark.parametrize("ffn,act,gated", [
    ("elu", jax.nn.elu, False), ("selu", jax.nn.selu, False),
    ("sigmoid", jax.nn.sigmoid, False), ("softplus", jax.nn.softplus, False),
    ("gelu_tanh", functools.partial(jax.nn.gelu, approximate=True), False),
    ("silu", jax.nn.swish, False), ("glu", jax.nn.sigmoid, True),
    ("geglu", functools.partial(jax.nn.gelu, approximate=True), True),
    ("reglu", jax.nn.relu, True), ("swiglu", jax.nn.swish, True),
    ("bilinear", lambda x: x, True)])
def test_activation_rows_compute_the_papers_formula(ffn, act, gated):
    """GeLU ... Softplus: wo(act(x wi)); the GLU family (LiGLU = bilinear): wo(act(x wi_0) *
    (x wi_1)), against jax.nn's functions on the block's own weights."""
    cfg = tiny(ffn=ffn)
    x = jax.random.normal(KEY(1), (2, 5, cfg.d_model))
    mlp = L.MLP(cfg)
    params = nn.meta.unbox(mlp.init(KEY(0), x)["params"])
    k = lambda n: params[n]["kernel"]  # noqa: E731
    hidden = act(x @ k("wi_0")) * (x @ k("wi_1")) if gated else act(x @ k("wi"))
    np.testing.assert_allclose(mlp.apply({"params": params}, x), hidden @ k("wo"),
                               rtol=2e-5, atol=2e-5)


# ----------------------------------------------------------------------------- normalization

@pytest.mark.parametrize("norm", ["none", "rmsnorm"])  # ReZero alone, and with a norm
def test_rezero_gate_starts_at_zero_and_every_block_is_the_identity(norm):
    cfg = tiny(rezero=True, norm=norm)
    model, params, batch = init(cfg)
    layers = params["encoder"]["layers"]
    alphas = {k: v for k, v in layers.items() if k.endswith("_rezero_alpha")}
    assert set(alphas) == {"attention_rezero_alpha", "mlp_rezero_alpha"}
    assert all(a.shape == (3,) and not a.any() for a in alphas.values())  # one per layer
    if norm == "none":
        assert not any("norm" in k for k in layers)
        emb = params["token_embedder"]["embedding"][batch["encoder_input_tokens"]]
        np.testing.assert_allclose(encode(model, params, batch), emb, rtol=1e-6)

    def loss(p):  # the gates get a gradient: training moves them off zero
        return jnp.sum(encode(model, p, batch) ** 2)
    grads = jax.grad(loss)(params)["encoder"]["layers"]
    assert np.abs(grads["attention_rezero_alpha"]).sum() > 0


def test_fixup_init_zeroes_each_branch_end_and_scales_the_rest():
    cfg = tiny(fixup=True, norm="none", num_encoder_layers=6, num_decoder_layers=6,
               d_model=64, d_ff=256)
    model, params, batch = init(cfg)
    enc = params["encoder"]["layers"]
    assert not enc["attention"]["out"]["kernel"].any() and not enc["mlp"]["wo"]["kernel"].any()
    # the reference's EncDecAttentionFixup keeps the plain attention init (mesh_tensorflow
    # fixup_layers.py :392-405): tests/test_reference_fidelity.py
    assert params["decoder"]["layers"]["encoder_decoder_attention"]["out"]["kernel"].any()
    branches = 2 * 6 + 3 * 6
    # He init (variance 2 / fan_in) over the number of branches in the FFN (flax's truncated
    # normal keeps the variance it is asked for)
    expected = np.sqrt(2.0 / cfg.d_model / branches)
    np.testing.assert_allclose(np.std(enc["mlp"]["wi"]["kernel"]), expected, rtol=0.1)
    np.testing.assert_allclose(enc["mlp_fixup_scale"], 1.0)
    np.testing.assert_allclose(enc["mlp_fixup_bias_in"], 0.0)
    # after the last layer: shift and scale in the encoder, shift only in the decoder
    assert set(params["encoder"]["final_fixup"]) == {"bias", "scale"}
    assert set(params["decoder"]["final_fixup"]) == {"bias"}
    emb = params["token_embedder"]["embedding"][batch["encoder_input_tokens"]]
    np.testing.assert_allclose(encode(model, params, batch), emb, rtol=1e-6)


# ----------------------------------------------------------------------------- sharing

def _leaves(tree) -> dict:
    return {jax.tree_util.keystr(p): x.shape
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_block_sharing_keeps_one_layer_of_params_and_reuses_it():
    shared = tiny(share_encoder_block=True)
    model, params, batch = init(shared)
    plain_params = init(tiny(scan_layers=False, num_encoder_layers=1))[1]
    enc = _leaves(params["encoder"])
    one = {k.replace("['layers_0']", ""): v for k, v in _leaves(plain_params["encoder"]).items()}
    assert {k.replace("['layers']['shared']['block']", ""): v for k, v in enc.items()} == one
    assert all(v[0] == 2 for k, v in _leaves(params["decoder"]).items() if "layers" in k)
    n = count_params(shared)
    assert n == layerwise_counts(shared)[0] == count_params(tiny(num_encoder_layers=1))
    # applying the one block three times: the same output as three unshared layers that
    # hold copies of its weights
    block = params["encoder"]["layers"]["shared"]["block"]
    copies = jax.tree_util.tree_map(lambda a: jnp.stack([a] * 3), block)
    unshared = tiny()
    p2 = dict(params, encoder=dict(params["encoder"], layers=copies))
    np.testing.assert_allclose(encode(build_model(unshared), p2, batch),
                               encode(model, params, batch), rtol=1e-5, atol=1e-5)


def test_block_shared_decoder_decodes_with_one_cache_per_layer():
    from t5lite.models import init_cache
    cfg = tiny(share_decoder_block=True)
    model, params, batch = init(cfg)
    full = model.apply({"params": params}, batch)["logits"]
    cache = init_cache(model, params, 2, 8, batch["encoder_input_tokens"])
    encoded = encode(model, params, batch)
    logits, _ = model.apply({"params": params, "cache": cache},
                            batch["decoder_input_tokens"][:, :1],
                            encoded, batch["encoder_input_tokens"], decode=True,
                            method=lambda m, *a, **k: m.decode(*a, **k), mutable=["cache"])
    np.testing.assert_allclose(logits[:, 0], full[:, 0], rtol=1e-4, atol=1e-4)


def test_universal_transformer_shares_one_layer_across_its_steps():
    cfg = tiny(share_encoder_block=True, share_decoder_block=True, universal_steps=5)
    model, params, batch = init(cfg)
    for stack in ("encoder", "decoder"):
        shared = params[stack]["layers"]
        assert shared["step_embedding"].shape == (5, cfg.d_model)
        assert all(len(s) <= 2 for s in _leaves(shared["shared"]).values())  # no layers axis
    assert np.isfinite(model.apply({"params": params}, batch)["logits"]).all()


UT = dict(share_encoder_block=True, share_decoder_block=True, universal_steps=3)


def test_universal_transformer_mix_layers_run_the_same_block_without_step_embedding():
    """UTLayerStack's 2 + 3 + 2 applications are the plain UT's 7 steps with the same block
    and a zero step embedding on the first and last two (cached decoding: one cache each)."""
    model, params, batch = init(tiny(**UT, universal_mix_layers=2))
    assert params["encoder"]["layers"]["step_embedding"].shape == (3, 32)
    steps = params["encoder"]["layers"]["step_embedding"]
    padded = jnp.concatenate([jnp.zeros((2, 32)), steps, jnp.zeros((2, 32))])
    seven = dict(params, encoder=dict(params["encoder"], layers=dict(
        params["encoder"]["layers"], step_embedding=padded)))
    plain = build_model(tiny(**dict(UT, universal_steps=7)))
    np.testing.assert_allclose(encode(model, params, batch), encode(plain, seven, batch),
                               rtol=1e-5, atol=1e-5)
    assert np.abs(encode(plain, seven, batch) - encode(
        plain, dict(seven, encoder=dict(seven["encoder"], layers=dict(
            seven["encoder"]["layers"], step_embedding=jnp.tile(steps[:1], (7, 1))))),
        batch)).max() > 1e-3  # the zero rows matter


def test_universal_transformer_gru_gating():
    """Each sub-layer's output y becomes (1 - u) y + u c (UTLayerStack's "gru" gating) with
    u = sigmoid([n(x), n(y)] W_u + b_u), r the same over (n(n(x)), n(n(y))) and
    c = sigmoid([n(r x), n(y)] W_c + b_c); the gates (3 x (2D x D + D) and a norm per
    sub-layer) are the count's difference, and are the block's: shared across the steps."""
    from t5lite.models import sharing
    cfg = tiny(**UT, universal_gating="gru")
    x, y = jax.random.normal(KEY(1), (2, 2, 5, 32))
    gate = sharing.GRUGate(cfg)
    p = nn.meta.unbox(gate.init(KEY(0), x, y)["params"])
    p["norm"]["scale"] = p["norm"]["scale"] * 1.5  # a norm that is not the identity's
    p["norm"]["bias"] = p["norm"]["bias"] + 0.1

    def n(a):
        a = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + cfg.norm_eps)
        return a * p["norm"]["scale"] + p["norm"]["bias"]

    def g(name, a, b):
        return jax.nn.sigmoid(np.concatenate([a, b], -1) @ p[name]["kernel"] + p[name]["bias"])
    u, r = g("update", n(x), n(y)), g("reset", n(n(x)), n(n(y)))
    want = (1 - u) * y + u * g("candidate", n(r * x), n(y))
    np.testing.assert_allclose(gate.apply({"params": p}, x, y), want, rtol=1e-4, atol=1e-5)
    gates = 3 * (2 * 32 * 32 + 32) + 2 * 32
    assert count_params(cfg) == count_params(tiny(**UT)) + (2 + 3) * gates
    model, params, batch = init(cfg)
    block = params["decoder"]["layers"]["shared"]["block"]
    assert {k for k in block if k.endswith("_gate")} == {
        "self_attention_gate", "cross_attention_gate", "mlp_gate"}
    assert block["mlp_gate"]["update"]["kernel"].shape == (64, 32)  # one copy, no steps axis
    assert np.isfinite(model.apply({"params": params}, batch)["logits"]).all()
    with pytest.raises(UserError, match="universal_steps"):
        build_model(tiny(universal_gating="gru"))


# ----------------------------------------------------------------------------- embeddings

def test_factorized_embedding_and_its_tied_softmax():
    cfg = tiny(factorized_embed_dim=8)
    model, params, batch = init(cfg)
    emb = params["token_embedder"]
    assert emb["table"]["embedding"].shape == (64, 8) and emb["project"].shape == (8, 32)
    assert count_params(cfg) == count_params(tiny()) - 64 * 32 + 64 * 8 + 8 * 32
    x = jax.random.normal(KEY(2), (2, 3, 32))
    logits = model.apply({"params": params}, x, method=lambda m, x: m.token_embedder.attend(x))
    np.testing.assert_allclose(logits, (x @ emb["project"].T) @ emb["table"]["embedding"].T,
                               rtol=1e-5, atol=1e-5)


def test_adam_rows_parametrize_the_embedding_like_a_classifier():
    """defaults_adam.gin's VocabEmbedding.scale_variable_like_classifier_weights: the table
    starts N(0, 1 / d), the lookup is times sqrt(d), the tied softmax reads it unscaled."""
    from t5lite.models import check
    cfg = tiny(embed_like_classifier=True, scale_tied_logits=False, vocab_size=512)
    model, params, batch = init(cfg)
    table = np.asarray(params["token_embedder"]["embedding"])
    assert abs(table.std() * 32 ** 0.5 - 1) < 0.05
    tokens = batch["encoder_input_tokens"]
    positions = jnp.broadcast_to(jnp.arange(10), (2, 10))
    got = model.apply({"params": params}, tokens, positions,
                      method=lambda m, t, p: m.encoder.embed(t, p))
    np.testing.assert_allclose(got, table[np.asarray(tokens)] * 32 ** 0.5, rtol=1e-5)
    x = jax.random.normal(KEY(2), (2, 3, 32))
    logits = model.apply({"params": params}, x, method=lambda m, x: m.decoder.logits(x))
    np.testing.assert_allclose(logits, np.asarray(x) @ table.T, rtol=1e-4, atol=1e-4)
    with pytest.raises(UserError, match="scale_tied_logits=False"):
        check(tiny(embed_like_classifier=True))


def test_embedding_tying_rows_count_their_tables():
    """Tied encoder/decoder inputs (untied softmax), tied decoder input and output (own encoder
    table), untied: one [V, D] table more per untied use; the untied model runs."""
    one = count_params(tiny())
    for tie_inputs, tie_output, tables in ((True, False, 2), (False, True, 2)):
        cfg = tiny(tie_encoder_decoder_embeddings=tie_inputs, tie_embeddings=tie_output)
        assert count_params(cfg) == one + (tables - 1) * 64 * 32
    cfg = tiny(tie_encoder_decoder_embeddings=False, tie_embeddings=False)
    model, params, batch = init(cfg)
    assert count_params(cfg) == one + 2 * 64 * 32
    enc_emb = params["encoder_token_embedder"]["embedding"]
    emb = params["token_embedder"]["embedding"]
    assert not np.allclose(enc_emb, emb)
    # the encoder reads its own table: a change to the decoder's leaves the encoding alone
    moved = dict(params, token_embedder={"embedding": emb + 1.0})
    np.testing.assert_allclose(encode(model, moved, batch), encode(model, params, batch))
    assert np.isfinite(model.apply({"params": params}, batch)["logits"]).all()


# ----------------------------------------------------------------------------- the table

TABLE = ablations.load_table("modifications")


def _paper_scale_cfg(row):
    return plan_row(TABLE, row, "/w", ("super_glue",), "paper")[0].cfg.model


# rows whose paper count does not follow from the reference code: the Synthesizers, pinned to
# the reference's variables instead (test_synthesizer_rows_count_the_references_variables)
COUNT_EXEMPT = tuple(
    r.name for r in modifications.ROWS if r.name.startswith("synthesizer_"))

# Mesh TF's Synthesizer variables in one self-attention layer, by form (D = d_model = H K,
# N = max_length 512, k = 16): which of q / k / v / kv / o [D, D] it makes (shared_kv and
# no_query in transformer_layers.Synthesizer) and its synthesizing weights
SYNTH_VARIABLES = {
    "dense": (3, lambda h, k, n, r: k * n),  # dense_minus: q, kv, o; pi [K, N]
    "dense_plus": (4, lambda h, k, n, r: k * n),
    "dense_plus_alpha": (4, lambda h, k, n, r: k * n + 1),
    "factorized": (2, lambda h, k, n, r: 2 * r * h * n),  # kv, o; R1, R2 [k, H, N]
    "random": (2, lambda h, k, n, r: n * h * n),  # kv, o; R [N, H, N]
    "random_plus": (4, lambda h, k, n, r: n * h * n),
    "random_plus_alpha": (4, lambda h, k, n, r: n * h * n + 1),
}


@pytest.mark.parametrize("form", list(SYNTH_VARIABLES))
def test_synthesizer_rows_count_the_references_variables(form):
    """Each Synthesizer row at paper scale has the vanilla's count with each of the 24
    self-attention layers' q / k / v / o swapped for the reference's variables, exactly."""
    m = _paper_scale_cfg(TABLE.row(f"synthesizer_{form}"))
    assert (m.max_length, m.synthesizer_rank) == (512, 16)
    projections, synth = SYNTH_VARIABLES[form]
    d, h, k = m.d_model, m.num_heads, m.head_dim
    layer = projections * d * h * k + synth(h, k, m.max_length, m.synthesizer_rank)
    vanilla = layerwise_counts(_paper_scale_cfg(TABLE.row("vanilla")))[0]
    want = vanilla + (m.num_encoder_layers + m.num_decoder_layers) * (layer - 4 * d * h * k)
    assert layerwise_counts(m)[0] == want


def test_factorized_synthesizer_logits_are_the_references_broadcast():
    """The reference's factorized form: sum_k R1[k, h, s] R2[k, h, s], the same logits for every
    query (no position bias here: sinusoidal positions), so every row of a head's weights is
    the softmax of that [H, S] vector."""
    cfg = tiny(attention_type="synthesizer_factorized", position="sinusoidal",
               scan_layers=False, synthesizer_rank=3)
    model, params, batch = init(cfg)
    att = params["encoder"]["layers_0"]["attention"]
    assert att["R1"].shape == (3, 4, 32) and "query" not in att and "key" not in att
    _, state = model.apply({"params": params}, batch["encoder_input_tokens"],
                           method=lambda m, t: m.encode(t), mutable=["intermediates"])
    weights_BHTS = np.asarray(state["intermediates"]["encoder"]["layers_0"]["attention"][
        "attention_weights"][0])
    want_HS = jax.nn.softmax(np.einsum("khs,khs->hs", att["R1"], att["R2"])[:, :10])
    assert_close_at_scale(weights_BHTS, np.broadcast_to(
        want_HS[None, :, None], weights_BHTS.shape), rtol=1e-5)


@pytest.mark.parametrize("name", [r.name for r in modifications.ROWS
                                  if r.name not in COUNT_EXEMPT])
def test_rows_have_the_papers_parameter_count_at_paper_scale(name):
    """Every row of this file at the paper's size has its Table 1 parameter count (within
    3% or the paper's 1M precision): the depth rows keep 223M, sharing and factorizing
    remove what the paper removes."""
    row = TABLE.row(name)
    n = layerwise_counts(_paper_scale_cfg(row))[0] / 1e6
    # the paper prints whole millions
    assert abs(n - row.paper[0]) <= max(0.03 * row.paper[0], 1.0), (name, n)


def test_every_row_plans_at_every_scale_and_estimates(capsys):
    """Each row of the table (all groups, whoever added them) resolves and validates its
    pretraining and finetuning configs at tiny scale, and --estimate plans (and validates)
    every row at paper scale and prints the whole table."""
    for row in TABLE.rows:
        pre, fts = plan_row(TABLE, row, "/w", default_tasks(TABLE, "tiny"), "tiny")
        assert pre.cfg.model.dropout_rate == 0.0 and pre.cfg.model.norm in (
            "layernorm", "rmsnorm", "none")
        assert all(ft.cfg.model.dropout_rate == 0.1 for ft in fts)
    out = ablations.estimate(TABLE, scale="paper")
    assert set(out["rows"]) == {r.name for r in TABLE.rows}
    assert "modifications at --scale paper" in capsys.readouterr().out


def test_paper_scale_is_the_papers_setting():
    vanilla = TABLE.row("vanilla")
    pre, fts = plan_row(TABLE, vanilla, "/w", default_tasks(TABLE, "paper"), "paper")
    m = pre.cfg.model
    assert (m.d_model, m.d_ff, m.num_heads, m.num_encoder_layers, m.ffn, m.norm, m.position,
            m.tie_embeddings, m.tie_encoder_decoder_embeddings) == (
        768, 3072, 12, 12, "relu", "layernorm", "relative", True, True)
    # vanilla_transformer.gin: DenseReluDense.use_bias = True (the FFN only); fixup.gin's
    # DenseReluDenseFixup.use_bias = False
    assert m.ffn_bias and not m.use_bias and not _paper_scale_cfg(TABLE.row("fixup")).ffn_bias
    assert pre.cfg.train.steps == 2 ** 19 and pre.cfg.data.batch_size == 128
    assert pre.cfg.data.mixture_or_task == "c4_span_corruption"
    sglue, _, _, wmt = fts  # SuperGLUE, XSum, WebQuestions (tests/test_xsum_webq.py), WMT
    assert sglue.cfg.optim.learning_rate == 5e-4 and sglue.start == 2 ** 19
    assert wmt.task == "wmt_ende_scratch" and wmt.cfg.train.steps == 150000
    assert wmt.cfg.checkpoint.init_from == "" and wmt.start == 0
    depth = _paper_scale_cfg(TABLE.row("depth24"))
    assert (depth.num_encoder_layers, depth.d_ff, depth.num_heads) == (24, 1536, 6)
    assert _paper_scale_cfg(TABLE.row("swiglu")).d_ff == 2048
    rezero = plan_row(TABLE, TABLE.row("rezero"), "/w", ("super_glue",), "paper")
    assert rezero[0].cfg.optim.name == "adamw" and rezero[1][0].cfg.optim.learning_rate == 5e-5
    # defaults_adam.gin + learning_rate_schedules/adam.gin, in both stages' model
    o = rezero[0].cfg.optim
    assert (o.learning_rate, o.schedule, o.warmup_steps, o.ramp_steps, o.eps) == (
        5e-4, "rsqrt", 10000, 4000, 1e-6)
    for st in (rezero[0], rezero[1][0]):
        m = st.cfg.model
        assert (m.scale_attn_logits, m.scale_tied_logits, m.embed_like_classifier) == (
            True, False, True)


def test_pretraining_columns_are_read_from_the_pretraining_run(tmp_path):
    """The measured Params / Step/s / early and final loss: from the pretraining workdir's
    metrics.jsonl as the trainer's logger writes it (the early loss at 1/8 of the steps, as
    65,536 of the paper's 524,288), and rendered with the lower loss in bold."""
    from t5lite.ablations import pretrain_columns
    from t5lite.ablations.files import write_json
    from t5lite.monitor.writers import MetricsLogger
    pre = plan_row(TABLE, TABLE.row("vanilla"), str(tmp_path), ("sentiment",), "tiny")[0]
    logger = MetricsLogger(pre.workdir, pre.cfg.train.steps, progress_bar=False)
    for step in range(10, 151, 10):
        logger.write(step, {"loss": 10.0 - step / 20, "steps_per_s": 2.0 + (step == 10)})
    logger.close()
    got = pretrain_columns.pretraining_metrics(pre)  # no eval loss logged: the training loss
    assert got["pretrain/early_loss"] == 10.0 - 20 / 20  # step 20 is nearest 150 / 8
    assert got["pretrain/final_loss"] == 10.0 - 150 / 20 and got["pretrain/steps_per_s"] == 2.0
    # the plan evaluates every 1/8 of the steps (19 of 150; 65,536 of the paper's 524,288),
    # and the held-out losses are the columns, as the paper's
    assert pre.cfg.train.eval_every == 19
    paper = plan_row(TABLE, TABLE.row("vanilla"), "/w", ("super_glue",), "paper")[0]
    assert paper.cfg.train.eval_every == 65536
    logger = MetricsLogger(pre.workdir, pre.cfg.train.steps, progress_bar=False)
    for step in sorted(set(range(10, 151, 10)) | {19, 38, 57, 76, 95, 114, 133}):
        if step % 10 == 0:
            logger.write(step, {"loss": 10.0 - step / 20, "steps_per_s": 2.0 + (step == 10)})
        if step % 19 == 0 or step == 150:
            logger.write(step, {"loss": 20.0 - step / 20}, prefix="eval")
    logger.close()
    got = pretrain_columns.pretraining_metrics(pre)
    assert got["pretrain/early_loss"] == 20.0 - 19 / 20  # the eval nearest 18.75
    assert got["pretrain/final_loss"] == 20.0 - 150 / 20 and got["pretrain/steps_per_s"] == 2.0
    assert got["pretrain/params_M"] == count_params(pre.cfg.model) / 1e6
    for name, loss in (("vanilla", 3.0), ("gelu", 2.5)):
        metrics = dict(got, **{"pretrain/final_loss": loss, "sentiment/accuracy": 50.0})
        write_json(str(tmp_path / "modifications" / name / "result.json"),
                   {"metrics": metrics, "runs": {"0": metrics}, "scale": "tiny"})
    text = ablations.render(TABLE, str(tmp_path))
    assert "| pretrain final_loss |" in text.splitlines()[2]
    assert "**2.50**" in text and "**3.00**" not in text
    # cost columns (parameters, step rate) are never bold, as the paper's own
    header = text.splitlines()[2].split(" | ")
    cost = [header.index(f"pretrain {k}") for k in ("params_M", "steps_per_s")]
    for line in text.splitlines()[4:6]:
        assert not any(line.split(" | ")[i].startswith("**") for i in cost), line


def test_render_shows_the_papers_columns_and_bolds_what_beats_the_baseline(tmp_path):
    text = ablations.render(TABLE, str(tmp_path))
    header = text.splitlines()[2]
    assert header.endswith(" | ".join(f"{c} (paper)" for c in modifications.COLUMNS) + " |")
    lines = {line.split(" | ")[0].strip("| ★"): line for line in text.splitlines()[4:]
             if line.startswith("|")}
    assert "| 223 | 11.1 | 3.50 | 2.182 | 1.838 | 71.66 |" in lines["Vanilla Transformer"]
    assert "**75.79**" in lines["GeLU"] and "**2.179**" in lines["GeLU"]
    assert "| 2.270 |" in lines["ELU"]  # a higher loss than the baseline: not bold
    assert "| 3.58 |" in lines["GeLU"]  # cost columns are never bold
    assert "Narang et al. 2021" in text


def test_moe_rows_follow_their_gins():
    """mixture_of_experts.gin / switch_transformer.gin at paper scale: 32 experts in layers 4,
    8 and 12 of both stacks and every FFN kernel initialised at scale 0.1; top-2 with d_ff / 2
    experts and capacity factor 2, or top-1 with d_ff experts, 1.2 and a 1e-2 jitter."""
    from t5lite.models.plan import ffn_layer_at
    for name, fields in (("mixture_of_experts", ("moe", 1536, 2.0, 0.0)),
                         ("switch_transformer", ("switch", 0, 1.2, 0.01))):
        m = _paper_scale_cfg(TABLE.row(name))
        assert (m.ffn_layer, m.expert_d_ff, m.expert_capacity_factor, m.router_jitter) == fields
        assert (m.num_experts, m.ffn_init_scale, m.moe_aux_loss_weight) == (32, 0.1, 0.01)
        assert m.moe_group_size == 1024  # MoE1D's group_size
        # the decoder at MoE1D's defaults (the gins' "deccoder/" lines reach no layer)
        assert (m.decoder_expert_capacity_factor, m.decoder_expert_capacity_factor_eval) == (
            1.25, 2.0)
        for stack in ("encoder", "decoder"):
            assert [i for i in range(12) if ffn_layer_at(m, stack, i, 12) != "dense"] == [3, 7, 11]
    assert _paper_scale_cfg(TABLE.row("vanilla")).ffn_init_scale == 1.0
