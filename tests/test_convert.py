"""Hugging Face import / export: exact round trips, scan vs unrolled layouts, CLI, user errors."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
import torch

import hf_fixtures as F
from t5lite import config as config_lib
from t5lite import convert
from t5lite.cli import main as cli
from t5lite.errors import UserError
from t5lite.store.checkpointing import load_params

KINDS = ["t5_v1_0", "t5_v1_1", "bert", "gpt2"]


def _flat(tree):
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def assert_bitwise_equal(a, b):
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        assert fa[k].dtype == fb[k].dtype == np.float32, k
        assert fa[k].shape == fb[k].shape, k
        assert np.array_equal(fa[k], fb[k]), k


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    """kind -> (saved HF dir, the torch model in eval mode)."""
    out = {}
    for kind in KINDS:
        model = F.make_hf_model(kind, seed=11)
        out[kind] = (F.save_hf_model(model, tmp_path_factory.mktemp(kind)), model)
    return out


def assert_same_torch_weights(a, b):
    """Every tensor of two torch models bit-identical (what "exact round trip" means)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape, k
        assert torch.equal(sa[k], sb[k]), k


# Logits of two PyTorch runs are compared at the parity tolerance, not bitwise: the in-memory
# model and the reloaded one may use different attention kernels (sdpa / eager) and float32 sums
# move with thread count and load (1.5e-5 seen under CI load). Exactness is asserted on weights.
TOL = F.PARITY_TOL


def _logits(model, hf_batch):
    with torch.no_grad():
        o = model(**hf_batch)
    return o.logits.numpy() if hasattr(o, "logits") else o.prediction_logits.numpy()


BATCHES = {"t5_v1_0": F.t5_batches, "t5_v1_1": F.t5_batches, "bert": F.bert_batches,
           "gpt2": F.gpt2_batches}


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_is_exact_and_loads_in_transformers(kind, hf_models, tmp_path):
    hf_dir, hf_model = hf_models[kind]
    cfg, params = convert.hf_to_t5lite(hf_dir)
    out = convert.t5lite_to_hf(cfg, params, str(tmp_path / "export"))
    # no tokenizer: an imported model names no task whose vocabulary fits it
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "t5lite_config.json"]
    cfg2, params2 = convert.hf_to_t5lite(out)
    assert cfg2.model == cfg.model
    assert_bitwise_equal(params, params2)

    exported = F.load_hf_model(out)
    assert type(exported).__name__ == type(hf_model).__name__
    assert_same_torch_weights(hf_model, exported)
    hf_batch, _, mask = BATCHES[kind](np.random.default_rng(0))
    a, b = _logits(hf_model, hf_batch), _logits(exported, hf_batch)
    assert np.abs(a - b)[mask.astype(bool)].max() < TOL


def test_config_fields(hf_models):
    v10, v11 = (convert.hf_to_t5lite(hf_models[k][0])[0].model for k in ("t5_v1_0", "t5_v1_1"))
    assert (v10.ffn, v10.tie_embeddings, v10.scale_tied_logits) == ("relu", True, True)
    assert (v11.ffn, v11.tie_embeddings) == ("geglu", False)
    assert (v10.num_encoder_layers, v10.num_decoder_layers, v10.head_dim) == (2, 3, 8)
    assert (v10.relative_buckets, v10.relative_max_distance, v10.vocab_size) == (8, 16, F.VOCAB)
    bert = convert.hf_to_t5lite(hf_models["bert"][0])[0].model
    assert (bert.architecture, bert.pre_norm, bert.norm, bert.ffn) == (
        "encoder_only", False, "layernorm", "gelu")
    assert (bert.num_token_types, bert.nsp_head, bert.max_length, bert.norm_eps) == (
        2, True, 24, 1e-12)
    gpt = convert.hf_to_t5lite(hf_models["gpt2"][0])[0].model
    assert (gpt.architecture, gpt.ffn, gpt.d_ff, gpt.tie_embeddings, gpt.scale_tied_logits) == (
        "decoder_only", "gelu_tanh", 48, True, False)


@pytest.mark.parametrize("kind", ["t5_v1_1", "gpt2"])
def test_scan_and_unrolled_layouts_hold_the_same_weights(kind, hf_models):
    cfg_s, scanned = convert.hf_to_t5lite(hf_models[kind][0], scan_layers=True)
    cfg_u, unrolled = convert.hf_to_t5lite(hf_models[kind][0], scan_layers=False)
    assert cfg_s.model.scan_layers and not cfg_u.model.scan_layers
    stack = "decoder"
    n = cfg_s.model.num_decoder_layers
    assert "layers" in scanned[stack] and f"layers_{n - 1}" in unrolled[stack]
    assert "layers" not in unrolled[stack] and f"layers_{n}" not in unrolled[stack]
    for i in range(n):
        layer_i = jax.tree.map(lambda x: x[i], scanned[stack]["layers"])
        assert_bitwise_equal(layer_i, unrolled[stack][f"layers_{i}"])
    # Both layouts export to identical HF tensors.
    assert convert.config_to_hf(cfg_s.model) == convert.config_to_hf(cfg_u.model)


def test_t5_tensor_mapping_details(hf_models):
    """Spot-check transposes / head splits against the raw HF tensors."""
    hf_cfg, t = convert.read_hf_dir(hf_models["t5_v1_1"][0])
    cfg, p = convert.hf_to_t5lite(hf_models["t5_v1_1"][0], scan_layers=False)
    h, k, d = hf_cfg["num_heads"], hf_cfg["d_kv"], hf_cfg["d_model"]
    # stored [fan_in, fan_out] (model.flat_kernels); the layer reshapes to [D, H, K] / [H, K, D]
    q = p["decoder"]["layers_2"]["encoder_decoder_attention"]["query"]["kernel"].reshape(d, h, k)
    np.testing.assert_array_equal(
        q, t["decoder.block.2.layer.1.EncDecAttention.q.weight"].T.reshape(d, h, k))
    o = p["encoder"]["layers_1"]["attention"]["out"]["kernel"].reshape(h, k, d)
    np.testing.assert_array_equal(
        o[1, 3], t["encoder.block.1.layer.0.SelfAttention.o.weight"][:, 1 * k + 3])
    np.testing.assert_array_equal(
        p["encoder"]["relpos_bias"]["rel_embedding"],
        t["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].T)
    np.testing.assert_array_equal(p["decoder"]["logits_dense"]["kernel"], t["lm_head.weight"].T)


def test_t5_unscaled_head_saved_tied(hf_models, tmp_path):
    """transformers 5.x saves v1.1 as tie_word_embeddings=true + scale_decoder_outputs=false
    and may omit lm_head: that is an untied, unscaled head equal to the embedding."""
    src = tmp_path / "v11_tied"
    shutil.copytree(hf_models["t5_v1_1"][0], src)
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    c = json.loads((src / "config.json").read_text())
    assert c["scale_decoder_outputs"] is False
    c["tie_word_embeddings"] = True
    (src / "config.json").write_text(json.dumps(c))
    cfg, p = convert.hf_to_t5lite(str(src))
    assert not cfg.model.tie_embeddings
    np.testing.assert_array_equal(p["decoder"]["logits_dense"]["kernel"],
                                  p["token_embedder"]["embedding"].T)


def test_cli_import_then_export(hf_models, tmp_path):
    hf_dir, hf_model = hf_models["t5_v1_0"]
    ckpt, out = tmp_path / "ckpt", tmp_path / "hf_out"
    assert cli.main(["convert", "import", hf_dir, str(ckpt)]) == 0
    assert (ckpt / "config.json").exists() and (ckpt / "params").is_dir()
    cfg, params = load_params(str(ckpt))  # the params-only format of CONTRACTS.md
    cfg_ref, params_ref = convert.hf_to_t5lite(hf_dir)
    assert cfg.model == cfg_ref.model
    assert_bitwise_equal(jax.tree.map(np.asarray, params), params_ref)
    assert cli.main(["convert", "import", hf_dir, str(ckpt)]) == 2  # refuses to overwrite

    assert cli.main(["convert", "export", str(ckpt), str(out)]) == 0
    exported = F.load_hf_model(out)
    assert_same_torch_weights(hf_model, exported)
    hf_batch, _, mask = F.t5_batches(np.random.default_rng(1))
    diff = np.abs(_logits(hf_model, hf_batch) - _logits(exported, hf_batch))
    assert diff[mask.astype(bool)].max() < TOL


# ----------------------------------------------------------------------------- user errors


def _copy(hf_models, kind, tmp_path):
    dst = tmp_path / f"{kind}_copy"
    shutil.copytree(hf_models[kind][0], dst)
    return dst


def _edit_config(path, **changes):
    c = json.loads((path / "config.json").read_text())
    c.update(changes)
    (path / "config.json").write_text(json.dumps(c))


def test_unsupported_architecture(hf_models, tmp_path):
    src = _copy(hf_models, "gpt2", tmp_path)
    _edit_config(src, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(UserError, match="unsupported architecture.*GPT2LMHeadModel"):
        convert.hf_to_t5lite(str(src))


def test_missing_files(hf_models, tmp_path):
    with pytest.raises(UserError, match="not a directory"):
        convert.hf_to_t5lite(str(tmp_path / "nope"))
    src = _copy(hf_models, "bert", tmp_path)
    os.remove(src / "model.safetensors")
    with pytest.raises(UserError, match="no weights.*model.safetensors"):
        convert.hf_to_t5lite(str(src))
    os.remove(src / "config.json")
    with pytest.raises(UserError, match="no config.json"):
        convert.hf_to_t5lite(str(src))


def test_vocab_mismatch_between_config_and_weights(hf_models, tmp_path):
    src = _copy(hf_models, "t5_v1_0", tmp_path)
    _edit_config(src, vocab_size=F.VOCAB + 1)
    with pytest.raises(UserError, match=r"shared.weight has shape \(99, 32\).*\(100, 32\)"):
        convert.hf_to_t5lite(str(src))


def test_unknown_tensors_are_not_dropped(hf_models, tmp_path):
    src = _copy(hf_models, "gpt2", tmp_path)
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(src / "model.safetensors"))
    tensors["score.weight"] = np.ones((2, 32), np.float32)  # e.g. a sequence-classifier head
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="no t5lite counterpart.*score.weight"):
        convert.hf_to_t5lite(str(src))


def test_export_checks_params_against_config(hf_models, tmp_path):
    cfg, params = convert.hf_to_t5lite(hf_models["gpt2"][0])
    wider = config_lib.replace(cfg, {"model.vocab_size": cfg.model.vocab_size + 1})
    with pytest.raises(UserError, match="token_embedder/embedding has shape"):
        convert.t5lite_to_hf(wider, params, str(tmp_path / "x"))  # params no longer match
    cfg = config_lib.replace(cfg, {"model.position": "rope"})
    with pytest.raises(UserError, match="cannot be exported as gpt2.*position='rope'"):
        convert.t5lite_to_hf(cfg, params, str(tmp_path / "y"))


def test_bert_masked_lm_without_nsp_head(tmp_path):
    """BertForMaskedLM (no pooler, no NSP) imports as an MLM-only encoder and exports back."""
    import transformers
    model = transformers.BertForMaskedLM(F.bert_config())
    F.randomize_(model, seed=5)
    src = F.save_hf_model(model.eval(), tmp_path / "mlm")
    cfg, params = convert.hf_to_t5lite(src)
    assert not cfg.model.nsp_head and not cfg.model.pooler and "pooler" not in params
    out = convert.t5lite_to_hf(cfg, params, str(tmp_path / "out"))
    assert json.loads(open(os.path.join(out, "config.json")).read())["architectures"] == [
        "BertForMaskedLM"]
    assert_bitwise_equal(params, convert.hf_to_t5lite(out)[1])
    hf_batch, _, mask = F.bert_batches(np.random.default_rng(2))
    exported = transformers.BertForMaskedLM.from_pretrained(out).eval()
    assert_same_torch_weights(model, exported)
    diff = np.abs(_logits(model, hf_batch) - _logits(exported, hf_batch))
    assert diff[mask.astype(bool)].max() < TOL


def test_other_weight_formats(hf_models, tmp_path):
    """pytorch_model.bin, sharded safetensors and bfloat16 weights give the same params."""
    _, model = hf_models["gpt2"]
    _, ref = convert.hf_to_t5lite(hf_models["gpt2"][0])
    os.makedirs(tmp_path / "bin")  # transformers 5 no longer writes .bin; older releases did
    shutil.copy(os.path.join(hf_models["gpt2"][0], "config.json"), tmp_path / "bin")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    assert_bitwise_equal(convert.hf_to_t5lite(str(tmp_path / "bin"))[1], ref)
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="20KB")
    assert os.path.exists(tmp_path / "sharded" / "model.safetensors.index.json")
    assert_bitwise_equal(convert.hf_to_t5lite(str(tmp_path / "sharded"))[1], ref)
    import copy
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(str(tmp_path / "bf16"))
    _, bf16 = convert.hf_to_t5lite(str(tmp_path / "bf16"))
    rounded = jax.tree.map(lambda x: np.asarray(x.astype(jax.numpy.bfloat16), np.float32), ref)
    assert_bitwise_equal(bf16, rounded)


def test_t5_rescaled_head_with_own_weights_folds_the_scale(hf_models, tmp_path):
    """tie_word_embeddings=true but a distinct lm_head in the file: transformers keeps both and
    still rescales; t5lite folds d_model**-0.5 into an untied kernel."""
    src = _copy(hf_models, "t5_v1_0", tmp_path)
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(src / "model.safetensors"))
    head = np.random.default_rng(0).normal(size=tensors["shared.weight"].shape)
    tensors["lm_head.weight"] = head.astype(np.float32)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    cfg, p = convert.hf_to_t5lite(str(src))
    assert not cfg.model.tie_embeddings
    np.testing.assert_allclose(p["decoder"]["logits_dense"]["kernel"],
                               head.T * cfg.model.d_model ** -0.5, rtol=1e-6)


def test_bert_preset_with_pooler_but_no_nsp_exports_as_masked_lm_without_unexpected_keys(
        tmp_path):
    """The BERT presets (MLM pretraining: pooler, no NSP head) export as BertForMaskedLM, which
    has no pooler: the untrained pooler is left out, so transformers loads every tensor it gets
    and reports none unexpected or missing; the export imports back bit-exactly."""
    import transformers
    cfg = config_lib.load_config("bert_tiny")
    assert cfg.model.pooler and not cfg.model.nsp_head
    params = _zeros_like_params(cfg.model, seed=0)
    out = convert.t5lite_to_hf(cfg.model, params, str(tmp_path / "hf"))
    _, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    cfg2, params2 = convert.hf_to_t5lite(out)
    assert not cfg2.model.pooler and not cfg2.model.nsp_head
    assert_bitwise_equal({k: v for k, v in params.items() if k != "pooler"}, params2)


def _zeros_like_params(m, seed=0):
    """Random float32 params of model config m (shapes from abstract init; no compile)."""
    import flax.linen as nn
    from t5lite.models import abstract_params
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32) * 0.02,
                        nn.meta.unbox(abstract_params(m)))


TOKENIZER_TEXTS = [
    "translate English to German: Hello world",
    "It's a 3.5-star movie -- isn't it? I'd say they've won 1,000,000 dollars!!",
    "  Leading spaces,\ttabs\nand newlines   and  double  spaces. ",
    "Café naïve résumé Straße Ünïcödé; emoji \U0001F600 and CJK 日本語 text.",
    "UPPER lower MiXeD CamelCaseWords and hyphen-ated-words, e.g. U.S.A. vs. USA.",
]


@pytest.fixture(scope="module")
def vocab_root():
    from t5lite import dataprep
    return dataprep.build.ensure_prepared(["vocab_t5", "vocab_gpt2", "vocab_bert"])


# preset, vocabulary, model vocab_size (the ids padded as the configs pad them)
TOKENIZER_CASES = [("t5_1_1_tiny", "t5lite_sp8k", 768), ("t5_1_1_tiny", "t5", 32128),
                   ("bert_tiny", "bert", 30592), ("gpt2_tiny", "gpt2", 50304)]


@pytest.mark.parametrize("preset,vocab_name,vocab_size", TOKENIZER_CASES,
                         ids=[c[1] for c in TOKENIZER_CASES])
def test_export_writes_a_tokenizer_that_encodes_as_t5lite(preset, vocab_name, vocab_size,
                                                         data_dir, vocab_root, tmp_path,
                                                         monkeypatch):
    """AutoTokenizer.from_pretrained(export) gives t5lite's ids, with the special tokens the
    tasks add (T5: EOS; BERT: [CLS] ... [SEP]), byte fallback (the test data dir's
    SentencePiece model falls back to bytes) and sentinels included."""
    import transformers
    from t5lite.tasks import vocabularies
    root = data_dir if vocab_name == "t5lite_sp8k" else vocab_root
    monkeypatch.setenv("T5LITE_DATA_DIR", root)  # where t5lite's own vocabulary reads
    cfg = config_lib.load_config(preset, [f"model.vocab_size={vocab_size}",
                                          f"eval.vocabulary={vocab_name}",
                                          f"data.data_dir={root}"])
    out = convert.t5lite_to_hf(cfg, _zeros_like_params(cfg.model), str(tmp_path / "hf"),
                               tokenizer=True)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    vocab = vocabularies.get_vocabulary(vocab_name)
    for text in TOKENIZER_TEXTS:
        ids = list(vocab.encode(text))
        if vocab_name == "bert":
            want = [vocab.cls_id] + ids + [vocab.sep_id]
        else:
            want = ids if vocab_name == "gpt2" else ids + [vocab.eos_id]
        assert tok(text)["input_ids"] == want, text
    if vocab_name == "t5lite_sp8k":
        byte_ids = vocab.encode("日本語")  # not among the test model's 600 pieces
        assert any(3 <= i < 3 + 256 for i in byte_ids)  # <0x00>..<0xFF> follow pad, eos, unk
        assert tok("日本語")["input_ids"][:-1] == byte_ids
    if vocab.extra_ids:
        n = vocab.vocab_size
        assert tok.convert_tokens_to_ids(["<extra_id_0>", f"<extra_id_{vocab.extra_ids - 1}>"]
                                         ) == [n - 1, n - vocab.extra_ids]
    assert (tok.pad_token_id if vocab_name != "gpt2" else 0) == vocab.pad_id
    hf_cfg = json.loads(open(os.path.join(out, "config.json")).read())
    assert vocab_name == "bert" or hf_cfg["eos_token_id"] == vocab.eos_id  # generate() stops
    assert tok.decode(tok(TOKENIZER_TEXTS[0])["input_ids"], skip_special_tokens=True) == (
        vocab.decode(vocab.encode(TOKENIZER_TEXTS[0])))


def test_export_states_when_no_tokenizer_fits(hf_models, tmp_path, capsys):
    """An imported HF model names no task of its own: the default task's vocabulary does not
    fit it, so export writes weights only and says why (required: a UserError, nothing
    written)."""
    src, _ = hf_models["t5_v1_1"]
    cfg, params = convert.hf_to_t5lite(src)
    with pytest.raises(UserError, match="does not fit|data prepare"):
        convert.t5lite_to_hf(cfg, params, str(tmp_path / "required"), tokenizer=True)
    assert not os.path.exists(tmp_path / "required")
    assert cli.main(["convert", "import", src, str(tmp_path / "imported")]) == 0
    assert cli.main(["convert", "export", str(tmp_path / "imported"), str(tmp_path / "hf")]) == 0
    assert "no tokenizer written" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "model.safetensors",
                                                   "t5lite_config.json"]


def test_eval_of_an_imported_bert_says_to_finetune_first(hf_models, tmp_path, data_dir, capsys):
    """BertForPreTraining has no classifier head: `t5lite eval` on it says to finetune first
    (with the command), not that BERT cannot generate."""
    ckpt = str(tmp_path / "bert")
    assert cli.main(["convert", "import", hf_models["bert"][0], ckpt]) == 0
    capsys.readouterr()
    assert cli.main(["eval", "--workdir", ckpt, "--task", "sentiment_cls"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no classifier head" in err
    assert "finetune it on a classification task first" in err
    assert "--set checkpoint.init_from=" in err


def test_import_keeps_the_finetuning_setup_an_export_wrote_or_says_what_it_guessed(
        hf_models, tmp_path, capsys):
    """A finetuned t5lite model exported and imported back keeps its task, feature lengths,
    decoding and every other t5lite field (t5lite_config.json); a Hugging Face dir without it,
    or whose config.json no longer matches it, imports with the defaults named."""
    cfg = config_lib.load_config("t5_1_1_tiny", [
        "data.mixture_or_task=sentiment", "data.feature_lengths={'inputs': 48, 'targets': 6}",
        "decode.method=beam", "decode.beams=3", "model.dropout_rate=0.05"])
    out = convert.t5lite_to_hf(cfg, _zeros_like_params(cfg.model), str(tmp_path / "hf"),
                               tokenizer=False)
    for scan in (True, False):
        back, _, note = convert.import_hf(out, scan_layers=scan)
        want = config_lib.replace(cfg, {"model.scan_layers": scan})
        assert config_lib.to_dict(back) == config_lib.to_dict(want)
        assert "kept the t5lite setup" in note and "sentiment" in note
    ckpt = str(tmp_path / "ckpt")
    assert cli.main(["convert", "import", out, ckpt]) == 0
    assert "kept the t5lite setup" in capsys.readouterr().out
    assert load_params(ckpt)[0].data.mixture_or_task == "sentiment"

    _edit_config(tmp_path / "hf", dropout_rate=0.2)  # config.json edited after the export
    back, _, note = convert.import_hf(out)
    assert back.data.mixture_or_task == config_lib.Config().data.mixture_or_task
    assert "describes another model" in note and "data.mixture_or_task=" in note

    note = convert.import_hf(hf_models["t5_v1_0"][0])[2]
    assert note.startswith("config.json holds no t5lite setup") and "--set" in note


def test_import_states_an_unusable_saved_setup(hf_models, tmp_path):
    """A damaged t5lite_config.json is named, never fatal: the weights still import."""
    src = _copy(hf_models, "gpt2", tmp_path)
    (src / "t5lite_config.json").write_text('{"model": {"no_such_field": 1}}')
    cfg, _, note = convert.import_hf(str(src))
    assert cfg.model.architecture == "decoder_only"
    assert "t5lite_config.json is not a t5lite config" in note and "defaults" in note
