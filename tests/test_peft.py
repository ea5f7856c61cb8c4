"""PEFT: identity at init, trainable counts, frozen params bit-identical through the real train
step, no optimizer state for frozen params, gradual unfreezing without recompiles, LoRA merge,
PEFT-only save / load, and a trainer run that writes workdir/peft/<step>."""

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util
from train_helpers import random_model_batch

from t5lite import config as config_lib
from t5lite import peft
from t5lite.config import ElectraConfig, ModelConfig, PeftConfig
from t5lite.errors import UserError
from t5lite.models import abstract_params
from t5lite.peft import build_model, stack_modules
from t5lite.mesh import partitioning
from t5lite.train import optim, trainer
from numerics import assert_close_at_scale

D, H, K, F, NL = 32, 4, 8, 64, 2


def tiny(arch="encoder_decoder", scan=True, **peft_kw) -> ModelConfig:
    return ModelConfig(architecture=arch, vocab_size=64, d_model=D, num_heads=H, head_dim=K,
                       d_ff=F, num_encoder_layers=NL, num_decoder_layers=NL, dropout_rate=0.0,
                       scan_layers=scan, peft=PeftConfig(**peft_kw))


def random_batch(cfg, b=2, n_in=8, n_tgt=6, seed=0):
    batch = random_model_batch(cfg, b, n_in, n_tgt, seed)
    if "encoder_input_tokens" in batch and b > 1:  # some padding at the end of row 1
        batch["encoder_input_tokens"][1, -2:] = 0
    return batch


def init(cfg, batch, seed=0):
    model = build_model(cfg)
    v = jax.jit(model.init)({"params": jax.random.key(seed), "dropout": jax.random.key(1)}, batch)
    return model, nn.meta.unbox(v["params"])


def shapes(cfg):
    """Abstract (unboxed) params: shapes only, nothing computed."""
    return nn.meta.unbox(abstract_params(cfg, modules=stack_modules(cfg)))


def flat(params):
    return {peft.path_str(p): v for p, v in jax.tree_util.tree_leaves_with_path(params)}


def base_only(params):
    """The params without the PEFT leaves (what the base model has)."""
    return traverse_util.unflatten_dict({k: v for k, v in flat(params).items()
                                         if not peft.is_peft_param(k)}, sep="/")


def base_cfg(cfg):
    return dataclasses.replace(cfg, peft=PeftConfig())


def forward(model, params, batch):
    return jax.jit(lambda p, b: model.apply({"params": p}, b))(params, batch)


# ----------------------------------------------------------------------------- init / identity


IDENTITY = dict(lora_rank=4, lora_targets=("query", "value", "wi"), adapter_dim=5, ia3=True)


@pytest.mark.parametrize("arch,scan,method", [
    ("encoder_decoder", True, IDENTITY),
    ("decoder_only", False, IDENTITY),
    pytest.param("encoder_decoder", False, dict(lora_rank=4), marks=pytest.mark.slow),
    pytest.param("encoder_decoder", True, dict(adapter_dim=5), marks=pytest.mark.slow),
    pytest.param("encoder_only", True, dict(ia3=True), marks=pytest.mark.slow),
])
def test_identity_init_equals_base_model(arch, scan, method):
    """LoRA (B = 0), adapters (up = 0) and (IA)^3 (ones) start as the base model."""
    cfg = tiny(arch, scan=scan, **method)
    batch = random_batch(cfg)
    model, params = init(cfg, batch)
    names = {k.split("/")[-1] for k in flat(params) if peft.is_peft_param(k)}
    assert names, "no PEFT params"
    base_model = build_model(base_cfg(cfg))
    out = forward(model, params, batch)["logits"]
    ref = forward(base_model, base_only(params), batch)["logits"]
    assert_close_at_scale(out, ref, rtol=1e-6)


ALL_DENSE = ("query", "key", "value", "out", "wi", "wi_0", "wi_1", "wo")
EVERY_METHOD = dict(lora_rank=4, lora_targets=ALL_DENSE, ia3=True, prefix_tokens=3,
                    adapter_dim=5, prompt_tokens=2)


def tree_case(arch, peft_kw, **kw) -> ModelConfig:
    base = dict(architecture=arch, vocab_size=64, d_model=32, num_heads=4, head_dim=8,
                d_ff=64, num_encoder_layers=2, num_decoder_layers=2, max_length=32)
    return ModelConfig(peft=PeftConfig(**peft_kw), **dict(base, **kw))


BERT_LIKE = dict(position="learned", use_bias=True, pre_norm=False, embed_norm=True,
                 norm="layernorm", ffn="gelu")
TREE_CASES = {  # the file's cases: every PEFT method on each family and layer layout
    "t5_scanned": tree_case("encoder_decoder", EVERY_METHOD, position="relative"),
    "t5_unrolled_unflat": tree_case("encoder_decoder", EVERY_METHOD, scan_layers=False,
                                    flat_kernels=False, position="relative", ffn="geglu",
                                    tie_embeddings=False),
    "t5_shared": tree_case("encoder_decoder", dict(lora_rank=2, prompt_tokens=2, ia3=True),
                           shared_encoder_decoder=True, position="relative"),
    "gpt_scanned": tree_case("decoder_only", EVERY_METHOD, position="learned", use_bias=True,
                             norm="layernorm", ffn="swiglu"),
    "prefix_lm_unrolled": tree_case("prefix_lm", dict(EVERY_METHOD, lora_targets=("q*", "wo")),
                                    scan_layers=False, position="rope"),
    "bert": tree_case("encoder_only", EVERY_METHOD, num_token_types=2, nsp_head=True,
                      num_classes=3, **BERT_LIKE),
    "electra": tree_case("encoder_only", dict(lora_rank=2, prompt_tokens=2, adapter_dim=4,
                                              prefix_tokens=2), embed_dim=16,
                         electra=ElectraConfig(rtd_head=True, generator_d_model=16),
                         **BERT_LIKE),
}


@pytest.mark.parametrize("name", sorted(TREE_CASES))
def test_peft_param_tree_is_the_checkpoint_format(name):
    """Param paths and shapes of PEFT models (part of the checkpoint format) are exactly those
    recorded in peft_param_trees.json, written when PEFT lived inside the model code."""
    with open(os.path.join(os.path.dirname(__file__), "peft_param_trees.json")) as f:
        want = json.load(f)[name]
    got = {k: list(v.shape) for k, v in flat(shapes(TREE_CASES[name])).items()}
    assert got == want


def test_core_model_code_never_imports_peft():
    """PEFT reaches the model from outside (peft.build_model passes its modules in); the core
    refuses a PEFT config it was not given the modules for instead of dropping the method."""
    import ast
    import glob

    import t5lite.models as models_pkg
    from t5lite import models
    root = os.path.dirname(models_pkg.__file__)
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        name = os.path.basename(path)
        with open(path) as f:
            tree = ast.parse(f.read())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                     for a in n.names]
        assert not [m for m in imported if "peft" in m], name
    lora = ModelConfig(peft=PeftConfig(lora_rank=2))
    with pytest.raises(UserError, match="t5lite.peft.build_model"):
        models.build_model(lora)
    assert isinstance(build_model(lora), nn.Module)


@pytest.mark.parametrize("arch,method,scan", [
    ("encoder_decoder", dict(prompt_tokens=3, prefix_tokens=2), True),
    ("decoder_only", dict(prompt_tokens=3), False),
    pytest.param("encoder_only", dict(prompt_tokens=3), True, marks=pytest.mark.slow),
    pytest.param("encoder_decoder", dict(prefix_tokens=2), False, marks=pytest.mark.slow),
    pytest.param("decoder_only", dict(prefix_tokens=2), True, marks=pytest.mark.slow),
])
def test_prompt_and_prefix_run_finite_and_change_outputs(arch, method, scan):
    cfg = tiny(arch, scan=scan, **method)
    batch = random_batch(cfg)
    model, params = init(cfg, batch)
    out = forward(model, params, batch)["logits"]
    ref = forward(build_model(base_cfg(cfg)), base_only(params), batch)["logits"]
    assert out.shape == ref.shape  # the soft prompt is stripped from the outputs
    assert bool(jnp.all(jnp.isfinite(out)))
    assert not np.allclose(out, ref, atol=1e-4)


def test_prompt_does_not_leak_between_packed_segments():
    """Two packed examples in one row give the same outputs as each alone."""
    cfg = tiny("encoder_only", prompt_tokens=3)
    b = random_batch(cfg, b=1, n_in=8)
    tokens = b["encoder_input_tokens"].copy()
    tokens[:] = np.arange(1, 9)
    packed = dict(b, encoder_input_tokens=tokens,
                  encoder_segment_ids=np.array([[1, 1, 1, 1, 2, 2, 2, 2]], np.int32),
                  encoder_positions=np.array([[0, 1, 2, 3, 0, 1, 2, 3]], np.int32))
    model, params = init(cfg, packed)
    out = forward(model, params, packed)["logits"]
    second = dict(packed, encoder_input_tokens=np.concatenate([tokens[:, 4:], 0 * tokens[:, 4:]],
                                                              1),
                  encoder_segment_ids=np.array([[1, 1, 1, 1, 0, 0, 0, 0]], np.int32),
                  encoder_positions=np.array([[0, 1, 2, 3, 0, 0, 0, 0]], np.int32))
    alone = forward(model, params, second)["logits"]
    np.testing.assert_allclose(out[:, 4:], alone[:, :4], atol=1e-5)


def test_prefix_tuning_decodes_with_cache_like_the_full_forward():
    from t5lite.models import init_cache
    cfg = tiny("decoder_only", prefix_tokens=2)
    batch = random_batch(cfg, n_tgt=5)
    model, params = init(cfg, batch)
    full = forward(model, params, batch)["logits"]
    cache = init_cache(model, params, 2, 5)
    step = jax.jit(lambda c, t: model.apply({"params": params, "cache": c}, t, decode=True,
                                            mutable=["cache"], method="decode"))
    outs = []
    for i in range(5):
        logits, mutated = step(cache, batch["decoder_input_tokens"][:, i:i + 1])
        cache = mutated["cache"]
        outs.append(logits)
    np.testing.assert_allclose(np.concatenate(outs, 1), full, atol=1e-4, rtol=1e-4)


def test_prompt_tuning_refuses_cached_decoding_of_decoder_only():
    from t5lite.models import init_cache
    cfg = tiny("decoder_only", prompt_tokens=2)
    model, params = init(cfg, random_batch(cfg))
    with pytest.raises(UserError, match="prefix tuning"):
        init_cache(model, params, 2, 5)


# ----------------------------------------------------------------------------- counts


def test_trainable_counts_per_method():
    r, n, a = 4, 3, 5
    arch = "encoder_only"  # one stack of NL layers, no fresh heads (num_classes=0)
    expected = {
        "lora": (dict(lora_rank=r, lora_targets=("query", "value", "wo")),
                 NL * (2 * (D * r + r * H * K) + (F * r + r * D))),
        "prompt": (dict(prompt_tokens=n), n * D),
        "prefix": (dict(prefix_tokens=n), NL * 2 * n * H * K),
        "adapters": (dict(adapter_dim=a), NL * (D + D * a + a * D)),  # norm, wi, wo
        "ia3": (dict(ia3=True), NL * (2 * H * K + F)),
    }
    base_total = None
    for name, (kw, want) in expected.items():
        for scan in (True, False):
            cfg = tiny(arch, scan=scan, **kw)
            params = shapes(cfg)
            train, total = peft.count_trainable(params, peft.trainable_mask(cfg, params))
            assert train == want, (name, scan)
            if base_total is None:
                base_total = peft.count_trainable(shapes(base_cfg(cfg)))[1]
            assert total == base_total + want, (name, scan)
            assert f"trainable params: {want:,} of {total:,}" in peft.describe(cfg, params)
    # a fresh classifier head trains too (train_also), and freeze globs win
    cfg = dataclasses.replace(tiny(arch, lora_rank=r), num_classes=3)
    params = shapes(cfg)
    lora = NL * 2 * (D * r + r * H * K)
    assert peft.count_trainable(params, peft.trainable_mask(cfg, params))[0] == lora + D * 3 + 3
    cfg.peft.freeze = ("encoder/layers/attention/value/*",)
    assert (peft.count_trainable(params, peft.trainable_mask(cfg, params))[0]
            == lora // 2 + D * 3 + 3)


def test_freezing_alone_and_everything_frozen_error():
    cfg = tiny("encoder_only", freeze=("token_embedder/*", "encoder/layers/*"))
    params = shapes(cfg)
    f = flat(params)
    want = sum(math.prod(v.shape) for k, v in f.items()
               if not k.startswith(("token_embedder/", "encoder/layers/")))
    assert peft.count_trainable(params, peft.trainable_mask(cfg, params))[0] == want
    cfg.peft.freeze = ("*",)
    with pytest.raises(UserError, match="no parameter trainable"):
        peft.trainable_mask(cfg, params)


# ----------------------------------------------------------------------------- training


def full_config(arch, scan, **peft_kw):
    cfg = config_lib.Config(name="peft_test")
    cfg.model = dataclasses.replace(tiny(arch, scan=scan, **peft_kw), position="learned",
                                    max_length=32)
    cfg.data.feature_lengths = {"inputs": 8, "targets": 6}
    cfg.data.batch_size = 8
    cfg.optim = config_lib.OptimizerConfig(name="adamw", learning_rate=1e-2, schedule="constant",
                                           warmup_steps=0, weight_decay=0.1)
    cfg.train.steps = 4
    return cfg


def run_steps(cfg, steps, batch_seed=0):
    model = build_model(cfg.model)
    mesh = partitioning.make_mesh(cfg.mesh)
    tx = optim.optimizer_for(cfg, cfg.train.steps)
    state, shardings = trainer.create_train_state(cfg, model, mesh, tx)
    params0 = jax.device_get(state.params)
    opt_size = sum(x.size for x in jax.tree.leaves(state.opt_state))
    step = trainer.make_train_step(cfg, model, tx, mesh, shardings)
    batch = random_batch(cfg.model, b=cfg.data.batch_size, seed=batch_seed)
    batch = partitioning.global_batch(batch, partitioning.batch_sharding(mesh))
    history, losses = [], []
    for _ in range(steps):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
        history.append(jax.device_get(state.params))
    return params0, history, losses, opt_size, step


@pytest.mark.parametrize("arch,scan,method", [
    ("encoder_decoder", True, dict(lora_rank=4)),
    ("encoder_only", False, dict(adapter_dim=4, ia3=True, prompt_tokens=2, prefix_tokens=2)),
    pytest.param("encoder_decoder", False,
                 dict(lora_rank=4, lora_targets=("query", "value", "wi", "wo")),
                 marks=pytest.mark.slow),
    pytest.param("decoder_only", True, dict(adapter_dim=4, ia3=True), marks=pytest.mark.slow),
])
def test_frozen_params_bit_identical_after_training(arch, scan, method):
    cfg = full_config(arch, scan, **method)
    params0, history, losses, opt_size, _ = run_steps(cfg, 3)
    mask = flat(peft.trainable_mask(cfg.model, params0))
    before, after = flat(params0), flat(history[-1])
    n_train = sum(before[k].size for k, t in mask.items() if t)
    for k, t in mask.items():
        if t:
            assert not np.array_equal(before[k], after[k]) or k.endswith(("lora_a", "/bias")), k
        else:
            assert np.array_equal(before[k], after[k]), k  # bit-identical
    # adamw state: mu and nu for the trainable params only (+ scalar counts)
    assert 2 * n_train <= opt_size <= 2 * n_train + 16
    assert losses[-1] < losses[0]


def test_lora_gradient_accumulation_equals_one_batch():
    """The trainable-subset gradients accumulate over micro-batches like full ones."""
    cfg = full_config("encoder_decoder", True, lora_rank=4)
    _, one, losses_one, _, _ = run_steps(cfg, 1)
    cfg.train.grad_accum_steps = 2
    _, acc, losses_acc, _, _ = run_steps(cfg, 1)
    np.testing.assert_allclose(losses_acc, losses_one, rtol=1e-5)
    for k, v in flat(one[-1]).items():
        np.testing.assert_allclose(flat(acc[-1])[k], v, atol=1e-5, err_msg=k)


def test_gradual_unfreezing_opens_top_layers_first_without_recompiling():
    cfg = full_config("encoder_only", True, unfreeze_every=2, unfreeze_layers=1)
    cfg.model.num_classes = 2
    cfg.train.steps = 6
    params0, history, _, _, step = run_steps(cfg, 6)
    p0 = flat(params0)

    def changed(i, key, layer=None):
        a, b = p0[key], flat(history[i])[key]
        if layer is not None:
            a, b = a[layer], b[layer]
        return not np.array_equal(a, b)

    q = "encoder/layers/attention/query/kernel"
    # steps 1-2: heads + top layer (1); steps 3-4: + layer 0 and the embeddings
    assert changed(0, "class_dense/kernel") and changed(0, q, 1) and not changed(1, q, 0)
    assert not changed(1, "token_embedder/embedding")
    assert changed(2, q, 0) and changed(2, "token_embedder/embedding")
    assert step.jitted._cache_size() == 1  # the schedule lives in the optimizer state


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("tied", [True, False])
def test_gradual_unfreezing_groups_follow_the_paper(scan, tied):
    """T5 paper 3.5.1: encoder and decoder open in parallel from the top, one layer of each per
    episode; a tied input/output embedding trains throughout, an untied input embedding last."""
    cfg = dataclasses.replace(tiny("encoder_decoder", scan=scan), num_encoder_layers=3,
                              num_decoder_layers=3, tie_embeddings=tied)
    groups = {k: np.asarray(v) for k, v in flat(peft.unfreeze_groups(cfg, shapes(cfg))).items()}
    assert peft.total_layers(cfg) == 3
    for stack, attn in (("encoder", "attention"), ("decoder", "self_attention")):
        if scan:
            assert groups[f"{stack}/layers/{attn}/query/kernel"].ravel().tolist() == [2, 1, 0]
        else:
            assert [int(groups[f"{stack}/layers_{i}/{attn}/query/kernel"])
                    for i in range(3)] == [2, 1, 0]
    assert int(groups["decoder/decoder_norm/scale"]) == 0
    assert int(groups["token_embedder/embedding"]) == (0 if tied else 2)  # with the bottom layer
    assert int(groups["encoder/relpos_bias/rel_embedding"]) == 2
    if not tied:
        assert int(groups["decoder/logits_dense/kernel"]) == 0
    opened = [int(peft.opened_groups(
        dataclasses.replace(cfg, peft=PeftConfig(unfreeze_every=5)), s)) for s in (0, 4, 5, 14)]
    assert opened == [1, 1, 2, 3]


# ----------------------------------------------------------------------------- merge / save


@pytest.mark.parametrize("scan", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_merged_lora_equals_unmerged(scan):
    cfg = tiny("decoder_only", scan=scan, lora_rank=4, lora_alpha=8.0,
               lora_targets=("query", "key", "value", "out", "wi", "wo"))
    batch = random_batch(cfg)
    model, params = init(cfg, batch)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda p, v: (jnp.asarray(rng.normal(0, 0.1, v.shape), v.dtype)
                      if peft.path_str(p).endswith("lora_b") else v), params)
    out = forward(model, params, batch)["logits"]
    mcfg, merged = peft.merge_lora(cfg, params)
    assert mcfg.peft.lora_rank == 0 and not any("lora" in k for k in flat(merged))
    assert set(flat(merged)) == set(flat(base_only(params)))
    base, new = flat(base_only(params)), flat(merged)
    assert all(not np.allclose(base[k], new[k]) for k in new if k.endswith("wo/kernel"))
    np.testing.assert_allclose(forward(build_model(mcfg), merged, batch)["logits"], out,
                               atol=2e-4, rtol=2e-4)


def test_peft_only_save_and_load_on_top_of_base(tmp_path):
    cfg = full_config("encoder_only", True, lora_rank=2, ia3=True)
    cfg.model.num_classes = 2
    rng = np.random.default_rng(0)
    params0 = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype), shapes(cfg))
    mask = flat(peft.trainable_mask(cfg.model, params0))
    trained = traverse_util.unflatten_dict({k: v + rng.normal(size=v.shape).astype(v.dtype)
                                            if mask[k] else v for k, v in flat(params0).items()},
                                           sep="/")
    path = str(tmp_path / "peft")
    peft.save_peft(path, cfg, trained)
    saved_keys = set(flat(peft.peft_subset(cfg.model, trained)))
    assert "class_dense/kernel" in saved_keys and "token_embedder/embedding" not in saved_keys
    loaded_cfg, params = peft.load_peft(path, params0)  # the base = the untrained init
    assert loaded_cfg == cfg
    for k, v in flat(params).items():
        np.testing.assert_array_equal(v, flat(trained)[k], err_msg=k)
    with pytest.raises(UserError, match="not a PEFT params dir"):
        peft.load_peft(str(tmp_path), params0)


@pytest.mark.slow
def test_trainer_logs_counts_and_writes_peft_params(tmp_path, capsys):
    from train_helpers import synthetic_batches
    cfg = full_config("decoder_only", True, lora_rank=2)
    cfg.data.feature_lengths = {"targets": 8}
    cfg.checkpoint.every_steps, cfg.checkpoint.keep = 2, 1
    batches = synthetic_batches(cfg, cfg.train.steps)
    workdir = str(tmp_path / "run")
    trainer.train(cfg, workdir, train_iter=iter(batches),
                  eval_iter_fn=lambda: iter(synthetic_batches(cfg, 1)))
    assert sorted(os.listdir(os.path.join(workdir, "peft"))) == ["4"]  # keep=1
    from t5lite.store import checkpointing
    _, full_params = checkpointing.load_params(workdir)
    _, params = peft.load_peft(os.path.join(workdir, "peft", "4"),
                               jax.tree.map(jnp.zeros_like, full_params))
    lora = {k: v for k, v in flat(params).items() if "lora" in k}
    assert lora and all(np.array_equal(v, flat(full_params)[k]) for k, v in lora.items())
    n_lora = sum(v.size for k, v in lora.items())
    assert f"trainable params: {n_lora:,} of" in capsys.readouterr().out


# ----------------------------------------------------------------------------- memory


def _train_step_memory(cfg):
    """(temp, argument) bytes of the compiled train step on one CPU device (deterministic)."""
    from t5lite.tpu import compile as tpu_compile
    mesh = partitioning.make_mesh(cfg.mesh, jax.devices()[:1])
    _, traced = tpu_compile.trace_train_step(cfg, mesh, build_model(cfg.model),
                                              optim.optimizer_for(cfg, cfg.train.steps))
    with partitioning.activate(mesh):
        m = traced.lower().compile().memory_analysis()
    return m.temp_size_in_bytes, m.argument_size_in_bytes


def test_lora_train_step_holds_gradients_for_the_small_params_only():
    """Frozen params are not differentiated: the LoRA step's temporaries (gradients) and
    arguments (optimizer state) are far below full finetuning's. With gradients of every param
    and only the optimizer masking them, LoRA's temporaries were as large as full finetuning's."""
    def cfg_for(**peft_kw):
        cfg = full_config("encoder_decoder", True, **peft_kw)
        cfg.model = dataclasses.replace(cfg.model, vocab_size=128, d_model=128, head_dim=32,
                                        d_ff=512, num_encoder_layers=1, num_decoder_layers=1)
        cfg.data.batch_size = 2
        return cfg

    full_temp, full_args = _train_step_memory(cfg_for())
    lora_temp, lora_args = _train_step_memory(cfg_for(lora_rank=2))
    params = shapes(cfg_for().model)
    param_bytes = sum(4 * math.prod(x.shape) for x in jax.tree.leaves(params))
    assert lora_args < full_args / 2  # no optimizer state for frozen params
    # most of full finetuning's gradient bytes are gone from the LoRA step's temporaries
    assert lora_temp < full_temp - param_bytes / 2, (lora_temp, full_temp, param_bytes)
