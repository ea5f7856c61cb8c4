"""Issue 48: where `--scale paper` of the ablation tables follows the reference code (Mesh
TensorFlow at tensorflow/mesh da907937, the transformer_modifications gins, t5x) rather than
Flax's or Lample et al.'s defaults: dropout masks shared along the length, Mesh TF's
initializers, Fixup's powers of the branch count, the Funnel encoder's RMS norm, the product
key memory's sizes and values, the checkpoints kept and WMT's warm-up."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.ablations.tables import as_table
from t5lite.ablations.plan import plan_row
from t5lite.config import ModelConfig
from t5lite.config.rules import check_fields, check_model
from t5lite.errors import UserError
from t5lite.models import abstract_params, build_model, count_params, dummy_batch
from t5lite.models import layers as L
from t5lite.models import residual
from t5lite.models.pkm import ProductKeyMemory
from t5lite.train.optim import make_schedule

KEY = functools.partial(jax.random.key, impl="rbg")
MODS = as_table("modifications")
TRUNCATED_STD = 0.87962566103423978  # the std of N(0, 1) truncated to [-2, 2]


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                num_encoder_layers=2, num_decoder_layers=2, max_length=32, scan_layers=False)
    return ModelConfig(**{**base, **kw})


def init_params(cfg, lengths=None):
    model = build_model(cfg)
    batch = dummy_batch(cfg, 2, lengths or {"inputs": 8, "targets": 8})
    return nn.meta.unbox(jax.jit(functools.partial(model.init, deterministic=True))(
        {"params": KEY(0)}, batch)["params"])


def paper_plan(row="vanilla", tasks=("super_glue",), table=MODS):
    table = as_table(table)
    return plan_row(table, table.row(row), "/w", tasks, "paper")


# ------------------------------------------------------------------ 1. dropout masks


class _Sublayer(nn.Module):
    cfg: object

    @nn.compact
    def __call__(self, x, deterministic):
        return residual.sublayer(self, self.cfg, x, "mlp", lambda h: h, deterministic)


@pytest.mark.parametrize("layer", ["residual", "mlp_hidden"])
def test_dropout_mask_is_one_per_example_and_feature_when_broadcast(layer):
    """Mesh TF's sublayer_dropout (transformer.py :589-595) and DenseReluDense's hidden
    dropout (transformer_layers.py :66-69) draw one mask per example and feature; t5x's T5
    the same (broadcast_dims=(-2,)). With every position's input equal, every position's
    output is equal under a shared mask and not under one mask per element."""
    x_BLD = jnp.broadcast_to(jnp.linspace(0.5, 1.5, 32), (2, 16, 32))
    outs = {}
    for broadcast in ("none", "length"):
        cfg = tiny(dropout_rate=0.5, dropout_broadcast=broadcast, ffn_bias=True)
        module = _Sublayer(cfg) if layer == "residual" else L.MLP(cfg)
        rngs = {"params": KEY(0), "dropout": KEY(1)}
        params = module.init(rngs, x_BLD, True)
        outs[broadcast] = np.asarray(module.apply(params, x_BLD, False, rngs={"dropout": KEY(2)}))
    shared, own = outs["length"], outs["none"]
    np.testing.assert_array_equal(shared, np.broadcast_to(shared[:, :1], shared.shape))
    assert not np.array_equal(shared[0], shared[1])  # a mask per example
    assert not np.array_equal(own, np.broadcast_to(own[:, :1], own.shape))


def test_dropout_helper_shapes_the_mask_without_the_length_axis():
    cfg = tiny(dropout_rate=0.5, dropout_broadcast="length")
    assert L.dropout(cfg).broadcast_dims == (-2,)
    assert L.dropout(dataclasses.replace(cfg, dropout_broadcast="none")).broadcast_dims == ()
    with pytest.raises(UserError, match="dropout_broadcast"):
        check_fields(dataclasses.replace(cfg, dropout_broadcast="position"), "model")


@pytest.mark.parametrize("table", ["modifications", "table2"])
def test_paper_scale_broadcasts_dropout_and_presets_do_not(table):
    pre, fts = paper_plan(tasks=("super_glue",), table=table,
                          row="vanilla" if table == "modifications" else "encdec_denoising")
    for stage in [pre] + fts:
        assert stage.cfg.model.dropout_broadcast == "length"
    assert ModelConfig().dropout_broadcast == "none"


# ------------------------------------------------------------------ 2. initializers


def test_mesh_tf_dense_init_has_tfs_uncorrected_truncated_normal_std():
    """mesh_tensorflow/layers.py VarianceScalingInitializer (:342-362): TF's
    truncated_normal_initializer(stddev=sqrt(scale / fan_in)), which keeps the [-2, 2] cut
    of a unit normal: std 0.8796 sqrt(scale / fan_in). Flax's (t5x) divides by 0.8796."""
    fan_in, scale = 1024, 0.1
    for name, factor in (("mesh_tf", TRUNCATED_STD), ("t5x", 1.0)):
        cfg = tiny(initializers=name)
        w = np.asarray(L.kernel_init(cfg, scale)(KEY(0), (fan_in, 4096)))
        np.testing.assert_allclose(w.std(), factor * np.sqrt(scale / fan_in), rtol=0.005)
        assert np.abs(w).max() <= 2 * np.sqrt(scale / fan_in) / (1.0 if name == "mesh_tf"
                                                                 else TRUNCATED_STD)


def test_mesh_tf_attention_init_is_an_untruncated_normal_with_the_folded_query():
    """transformer/attention.py init_weights (:428-443): q / k / v / o from
    tf.random_normal_initializer, std fan_in^-1/2, the query's times head_dim^-1/2 (folded
    logits scaling)."""
    cfg = tiny(initializers="mesh_tf", d_model=512, num_heads=8, head_dim=64)
    params = init_params(cfg)["encoder"]["layers_0"]["attention"]
    d, k = cfg.d_model, cfg.head_dim
    for name, std in (("query", (d * k) ** -0.5), ("key", d ** -0.5), ("value", d ** -0.5),
                      ("out", d ** -0.5)):
        w = np.asarray(params[name]["kernel"])
        np.testing.assert_allclose(w.std(), std, rtol=0.01, err_msg=name)
        assert np.abs(w).max() > 3 * std, name  # not truncated at 2 std


def test_t5x_attention_init_folds_the_logits_scaling_as_t5x_and_hf_do():
    """t5x (examples/t5/layers.py MultiHeadDotProductAttention: query_init = kernel_init /
    sqrt(head_dim)) and Hugging Face's T5 (T5PreTrainedModel._init_weights, run here on torch):
    the query's std is (d_model * head_dim)^-1/2, the key's and value's d_model^-1/2, the
    output's (heads * head_dim)^-1/2; t5x's draws are truncated at 2 std, HF's are not."""
    import torch
    from transformers import T5Config, T5Model
    d, h, k = 512, 8, 64
    cfg = tiny(d_model=d, num_heads=h, head_dim=k)
    assert cfg.initializers == "t5x" and not cfg.scale_attn_logits
    params = init_params(cfg)["encoder"]["layers_0"]["attention"]
    torch.manual_seed(0)
    hf = T5Model(T5Config(vocab_size=64, d_model=d, d_kv=k, num_heads=h, d_ff=64,
                          num_layers=1, num_decoder_layers=1)).encoder.block[0].layer[0]
    for name, hf_name in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o")):
        ours = np.asarray(params[name]["kernel"])
        theirs = getattr(hf.SelfAttention, hf_name).weight.detach().numpy()
        want = (d * k) ** -0.5 if name == "query" else d ** -0.5
        np.testing.assert_allclose(theirs.std(), want, rtol=0.01, err_msg=name)
        np.testing.assert_allclose(ours.std(), want, rtol=0.01, err_msg=name)
        assert np.abs(ours).max() <= 2 * want / TRUNCATED_STD * 1.0001, name


def test_paper_scale_initializers_are_mesh_tfs_and_leave_the_step_key():
    from t5lite.ablations.estimation import step_key
    pre, fts = paper_plan()
    assert pre.cfg.model.initializers == "mesh_tf" == fts[0].cfg.model.initializers
    assert ModelConfig().initializers == "t5x"
    other = dataclasses.replace(pre.cfg, model=dataclasses.replace(pre.cfg.model,
                                                                   initializers="t5x"))
    assert step_key(other) == step_key(pre.cfg)  # initial values only: the same compile


# ------------------------------------------------------------------ 3. Fixup


def test_fixup_scales_attention_and_ffn_by_their_own_powers_of_the_branch_count():
    """fixup_layers.py: AttentionParamsFixup q / k / v at variance 2 * num_blocks^(-1/3) /
    fan_in (:163-179), DenseReluDenseFixup's wi at 2 / num_blocks / fan_in (:296-298), both
    "he" and truncated_normal per fixup.gin; the decoder's EncDecAttentionFixup keeps the plain
    attention params (:392-405): not zero at its output."""
    cfg = tiny(fixup=True, norm="none", d_model=256, num_heads=4, head_dim=64, d_ff=1024,
               scale_attn_logits=True)
    params = init_params(cfg)
    blocks = 2 * 2 + 3 * 2
    enc = params["encoder"]["layers_0"]
    d = cfg.d_model
    for name in ("query", "key", "value"):
        np.testing.assert_allclose(np.std(enc["attention"][name]["kernel"]),
                                   np.sqrt(2 * blocks ** (-1 / 3) / d), rtol=0.02, err_msg=name)
    np.testing.assert_allclose(np.std(enc["mlp"]["wi"]["kernel"]), np.sqrt(2 / blocks / d),
                               rtol=0.02)
    assert not enc["attention"]["out"]["kernel"].any() and not enc["mlp"]["wo"]["kernel"].any()
    cross = params["decoder"]["layers_0"]["encoder_decoder_attention"]
    np.testing.assert_allclose(np.std(cross["out"]["kernel"]), d ** -0.5, rtol=0.02)
    np.testing.assert_allclose(np.std(cross["query"]["kernel"]), d ** -0.5, rtol=0.02)


# ------------------------------------------------------------------ 4. Funnel


def test_funnel_row_has_rms_norm_in_its_encoder_and_layer_norm_in_its_decoder():
    """funnel_transformer.gin :17-27: the Funnel encoder's sublayers_per_layer and
    sublayers_final are sublayer_rms_norm (scale only); the decoder is the vanilla LayerStack."""
    pre, _ = paper_plan("funnel_transformer")
    assert pre.cfg.model.encoder_norm == "rmsnorm" and pre.cfg.model.norm == "layernorm"
    cfg = dataclasses.replace(tiny(norm="layernorm", num_encoder_layers=4, encoder_norm="rmsnorm"),
                              funnel_blocks=(2, 2))
    shapes = nn.meta.unbox(abstract_params(cfg))
    enc, dec = shapes["encoder"], shapes["decoder"]
    assert set(enc["encoder_norm"]) == {"scale"}
    assert set(enc["layers_0"]["pre_attention_layer_norm"]) == {"scale"}
    assert set(dec["decoder_norm"]) == {"scale", "bias"}
    assert set(dec["layers_0"]["pre_mlp_layer_norm"]) == {"scale", "bias"}
    with pytest.raises(UserError, match="encoder_norm"):
        check_model(tiny(architecture="decoder_only", encoder_norm="rmsnorm"))


# ------------------------------------------------------------------ 5. product key memory


def test_pkm_row_has_the_papers_421m_and_the_references_sizes():
    m = paper_plan("product_key_memory")[0].cfg.model
    assert (m.pkm_keys, m.pkm_knn, m.pkm_heads, m.pkm_key_dim) == (512, 32, 8, 128)
    assert round(count_params(m) / 1e6) == 421


def test_pkm_values_and_keys_are_initialised_as_memory_layers():
    """memory_layers.py :54-64: values from mtf.layers.embedding_weights (N(0, 1),
    layers.py :2062-2063), keys an mtf.get_variable without initializer (glorot uniform)."""
    cfg = tiny(initializers="mesh_tf", d_model=256, pkm_keys=64, pkm_heads=2, pkm_knn=4,
               pkm_key_dim=32)
    x = jnp.ones((1, 4, cfg.d_model))
    params = nn.meta.unbox(ProductKeyMemory(cfg).init({"params": KEY(0)}, x)["params"])
    np.testing.assert_allclose(np.std(params["values"]), 1.0, rtol=0.01)
    h, n, half = 2, 64, 16
    limit = np.sqrt(6 / (2 * h * (n + half)))  # fans over the last two dims x the leading ones
    keys = np.asarray(params["keys"])
    assert np.abs(keys).max() <= limit and np.abs(keys).max() > 0.95 * limit
    t5x = nn.meta.unbox(ProductKeyMemory(dataclasses.replace(cfg, initializers="t5x")).init(
        {"params": KEY(0)}, x)["params"])
    np.testing.assert_allclose(np.std(t5x["values"]), cfg.d_model ** -0.5, rtol=0.01)


# ------------------------------------------------------------------ 7, 8. checkpoints, WMT


def test_modifications_keep_a_checkpoint_every_2500_steps_and_webq_every_1000():
    _, fts = paper_plan(tasks=("super_glue", "xsum", "web_questions", "wmt_ende_scratch"))
    every = {ft.task: ft.cfg.checkpoint.every_steps for ft in fts}
    assert every == {"super_glue": 2500, "xsum": 2500, "web_questions": 1000,
                     "wmt_ende_scratch": 2500}
    # the T5 paper's tables keep one every 5,000
    _, (glue,) = paper_plan("encdec_denoising", ("glue",), "table2")
    assert glue.cfg.checkpoint.every_steps == 5000


def test_wmt_from_scratch_warms_up_over_20k_steps():
    _, (wmt,) = paper_plan(tasks=("wmt_ende_scratch",))
    o = wmt.cfg.optim
    assert (o.schedule, o.learning_rate, o.warmup_steps) == ("constant", 5e-4, 20000)
    lr = make_schedule(o, wmt.cfg.train.steps)
    assert float(lr(9999)) == pytest.approx(2.5e-4) and float(lr(30000)) == pytest.approx(5e-4)


# ------------------------------------------------------------------ 6. vocabulary


def test_modifications_read_narang_et_als_english_vocabulary_at_paper_scale():
    """transformer_modifications tasks.py :34 / :40-41: every task of the paper's code reads
    gs://t5-data/vocabs/cc_en.32000 with 100 extra ids, but WMT (:35, a 37k one not public)."""
    pre, fts = paper_plan(tasks=("super_glue", "xsum", "web_questions", "wmt_ende_scratch"))
    assert pre.cfg.data.paper_vocabulary == "cc_en"
    assert {ft.task: ft.cfg.data.paper_vocabulary for ft in fts} == {
        "super_glue": "cc_en", "xsum": "cc_en", "web_questions": "cc_en",
        "wmt_ende_scratch": "t5"}
    _, (glue,) = paper_plan("encdec_denoising", ("glue",), "table2")
    assert glue.cfg.data.paper_vocabulary == "t5"  # the T5 paper's tables: cc_all


def test_the_vocabulary_leaves_the_step_key():
    from t5lite.ablations.estimation import step_key
    pre, _ = paper_plan()
    other = dataclasses.replace(pre.cfg, data=dataclasses.replace(pre.cfg.data,
                                                                  paper_vocabulary="t5"))
    assert step_key(other) == step_key(pre.cfg)


def test_cc_en_is_read_from_its_url_at_first_use_and_says_so_when_it_cannot_be(monkeypatch):
    import seqio.vocabularies
    import tensorflow as tf
    from t5lite.tasks import vocabularies
    assert vocabularies.CC_EN_PATH == "gs://t5-data/vocabs/cc_en.32000/sentencepiece.model"
    opened = []

    def refuse(path, mode="r"):
        opened.append(path)
        raise tf.errors.PermissionDeniedError(None, None, "no credentials here")

    monkeypatch.setattr(seqio.vocabularies.tf.io.gfile, "GFile", refuse)  # seqio's reader
    vocab = vocabularies.RemoteSentencePieceVocabulary(vocabularies.CC_EN_PATH, 100)
    assert opened == []  # building it (registering the tasks) reads nothing
    with pytest.raises(UserError, match="cc_en.32000/sentencepiece.model"):
        vocab.encode("hello")
    assert opened == [vocabularies.CC_EN_PATH]
    assert vocabularies.get_vocabulary("cc_en").sentencepiece_model_file == \
        vocabularies.CC_EN_PATH


def test_paper_tasks_take_the_configs_vocabulary():
    import seqio
    from t5lite.tasks import builtin, vocabularies
    try:
        builtin.use_paper_vocabulary("cc_en")
        for name in ("c4_span_corruption", "paper_xsum", "paper_super_glue_boolq"):
            vocab = seqio.get_mixture_or_task(name).output_features["targets"].vocabulary
            assert vocab.sentencepiece_model_file == vocabularies.CC_EN_PATH, name
        member = seqio.get_mixture_or_task("paper_super_glue").tasks[0]
        assert member.output_features["targets"].vocabulary == vocabularies.get_vocabulary(
            "cc_en")  # the mixture holds the new tasks
    finally:
        builtin.use_paper_vocabulary("t5")
    vocab = seqio.get_mixture_or_task("paper_xsum").output_features["targets"].vocabulary
    assert vocab == vocabularies.get_vocabulary("t5")


# ------------------------------------------------------------------ 9. Adam, held-out loss


def test_mesh_tf_adam_has_no_bias_correction():
    """mesh_tensorflow/optimize.py AdamWeightDecayOptimizer.apply_grad (:171-186): m and v
    from zero, update = lr * m / (sqrt(v) + eps), no 1 - b^t; optax's adamw divides by it."""
    from t5lite.config import OptimizerConfig
    from t5lite.train.optim import make_optimizer
    kw = dict(name="adamw", learning_rate=1e-3, schedule="constant", warmup_steps=0,
              eps=1e-6, weight_decay=0.0)
    params = {"w": jnp.ones((3, 2))}
    grads = [{"w": jnp.array([[0.5, -2.0], [1e-3, 3.0], [-0.1, 0.0]])},
             {"w": jnp.array([[0.1, 1.0], [2.0, -3.0], [0.2, 0.5]])}]
    tx = make_optimizer(OptimizerConfig(bias_correction=False, **kw), 10)
    state, m, v = tx.init(params), 0.0, 0.0
    for g in grads:
        g = np.asarray(g["w"], np.float64)
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g ** 2
        upd, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
        np.testing.assert_allclose(upd["w"], -1e-3 * m / (np.sqrt(v) + 1e-6), rtol=1e-5)
    first, _ = make_optimizer(OptimizerConfig(**kw), 10).update(grads[0], tx.init(params),
                                                                params)
    g = np.asarray(grads[0]["w"])
    np.testing.assert_allclose(first["w"], -1e-3 * g / (np.abs(g) + 1e-6), rtol=1e-4)
    with pytest.raises(UserError, match="bias_correction"):
        make_optimizer(OptimizerConfig(bias_correction=False), 10)


def test_rezero_and_fixup_train_without_bias_correction():
    for row in ("rezero", "rezero_layer_norm", "rezero_rms_norm", "fixup"):
        pre, fts = paper_plan(row)
        assert not pre.cfg.optim.bias_correction and not fts[0].cfg.optim.bias_correction
    assert paper_plan()[0].cfg.optim.bias_correction  # Adafactor rows: untouched


def test_pretraining_losses_read_the_reference_perplexity_evals_100_batches():
    """mesh_tensorflow/transformer/utils.py run(perplexity_eval_steps=100) :2649 at the
    pretraining batch (128 x 512): 12,800 held-out sequences, not configs/quickstart's 4."""
    pre, _ = paper_plan()
    assert (pre.cfg.train.eval_steps, pre.cfg.data.batch_size) == (100, 128)
