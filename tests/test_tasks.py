"""Registered tasks and mixtures, get_dataset per architecture, determinism, a user's task."""

import importlib
import os
import shutil
import sys

import numpy as np
import pytest
import seqio

from t5lite.errors import UserError

ENC_DEC = {"encoder_input_tokens", "encoder_segment_ids", "encoder_positions",
           "decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights",
           "decoder_segment_ids", "decoder_positions"}
DEC = {"decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights",
       "decoder_segment_ids", "decoder_positions"}
ENC = {"encoder_input_tokens", "encoder_target_tokens", "encoder_loss_weights",
       "encoder_segment_ids", "encoder_positions"}


def _batches(name, arch, lengths, n=2, **kwargs):
    from t5lite.tasks import pipeline
    kwargs = {"batch_size": 4, "seed": 1, **kwargs}
    ds = pipeline.get_dataset(name, lengths, arch, **kwargs)
    return [b for _, b in zip(range(n), ds.as_numpy_iterator())]


def test_builtin_names_registered(data_dir):
    names = set(seqio.TaskRegistry.names())
    for objective in ("span_corruption", "iid_denoising", "bert_denoising", "mass_denoising",
                      "drop_tokens", "deshuffling", "prefix_lm", "lm", "mlm", "mlm_only"):
        assert f"corpus_{objective}" in names
    assert {"corpus_span_corruption_t5", "corpus_lm_gpt2", "corpus_mlm_bert", "sentiment",
            "translate_en_de", "summarize_debian", "topic_debian", "sentiment_cls"} <= names
    assert {"finetune_local", "finetune_local_temperature", "finetune_local_equal",
            "pretrain_finetune_local"} <= set(seqio.MixtureRegistry.names())


def test_missing_data_says_how_to_prepare(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("T5LITE_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match="t5lite data prepare corpus"):
        _batches("corpus_span_corruption", "encoder_decoder", {"inputs": 64, "targets": 16})
    with pytest.raises(UserError, match="t5lite data prepare sentiment"):
        _batches("sentiment", "encoder_decoder", {"inputs": 64, "targets": 8})


@pytest.mark.parametrize("task,arch,lengths,pack,keys", [
    ("corpus_span_corruption", "encoder_decoder", {"inputs": 64, "targets": 16}, True, ENC_DEC),
    ("corpus_lm", "decoder_only", {"targets": 64}, True, DEC),
    ("corpus_prefix_lm", "prefix_lm", {"inputs": 32, "targets": 32}, True,
     DEC | {"decoder_causal_attention"}),
    ("corpus_mlm_only", "encoder_only", {"inputs": 64}, True, ENC),
    ("corpus_mlm", "encoder_only", {"inputs": 64}, False,
     {"encoder_input_tokens", "encoder_target_tokens", "encoder_loss_weights",
      "encoder_token_type_ids", "nsp_labels"}),
    ("sentiment", "decoder_only", {"inputs": 64, "targets": 8}, True, DEC),
    ("sentiment_cls", "encoder_only", {"inputs": 64}, False,
     {"encoder_input_tokens", "encoder_target_tokens", "encoder_loss_weights", "class_labels"}),
])
def test_converter_contract_keys_and_packing(data_dir, task, arch, lengths, pack, keys):
    b = _batches(task, arch, lengths, n=1, pack=pack, shuffle=False)[0]
    assert set(b) == keys
    for k, v in b.items():
        assert v.dtype == np.int32
        if k in ("nsp_labels", "class_labels"):
            assert v.shape == (4,)
        else:
            side = "inputs" if k.startswith("encoder") else "targets"
            length = lengths[side]
            if arch in ("decoder_only", "prefix_lm") and "inputs" in lengths:
                length = lengths["inputs"] + lengths["targets"]  # prefix + targets in one row
            assert v.shape == (4, length), k
    for prefix in ("encoder", "decoder"):
        if f"{prefix}_segment_ids" in b:
            segments = b[f"{prefix}_segment_ids"]
            assert segments.min() >= 0 and segments.max() >= 1
            if task in ("sentiment", "corpus_prefix_lm"):  # short examples share a row
                assert segments.max() > 1
            # Pretraining chunks fill their rows (no packing needed).
    if "decoder_loss_weights" in b and task == "sentiment":
        # Loss only on the targets: few positions per example.
        assert b["decoder_loss_weights"].sum() < b["decoder_segment_ids"].astype(bool).sum()
    if "encoder_loss_weights" in b and task != "sentiment_cls":
        frac = b["encoder_loss_weights"].sum() / (b["encoder_input_tokens"] > 0).sum()
        assert 0.05 < frac < 0.3
    if "nsp_labels" in b:
        assert set(np.unique(b["nsp_labels"])) <= {0, 1}


def test_wrong_architecture_or_lengths_raise(data_dir):
    with pytest.raises(UserError, match="no inputs/targets pair"):
        _batches("corpus_lm", "encoder_decoder", {"inputs": 64, "targets": 64})
    with pytest.raises(UserError, match="lacks inputs"):
        _batches("corpus_span_corruption", "encoder_decoder", {"targets": 64})
    with pytest.raises(UserError, match="pack=False"):
        _batches("corpus_mlm", "encoder_only", {"inputs": 64}, pack=True)
    with pytest.raises(UserError, match="Did you mean"):
        _batches("corpus_span_corruptoin", "encoder_decoder", {"inputs": 64, "targets": 16})


def test_same_seed_same_batches_and_shards(data_dir):
    def same(x, y):
        return all(np.array_equal(x[k], y[k]) for k in x)

    # Random preprocessors (span corruption noise) ...
    lengths = {"inputs": 64, "targets": 16}
    a, b, c = (_batches("corpus_span_corruption", "encoder_decoder", lengths, n=1, seed=s,
                        shuffle=False)[0] for s in (7, 7, 8))
    assert same(a, b) and not same(a, c)
    # ... and shuffling.
    lengths = {"inputs": 64, "targets": 8}
    a, b, c = (_batches("sentiment", "encoder_decoder", lengths, n=1, seed=s)[0]
               for s in (7, 7, 8))
    assert same(a, b) and not same(a, c)
    shards = [_batches("sentiment", "encoder_decoder", {"inputs": 64, "targets": 8}, n=1,
                       shuffle=False, split="validation", num_epochs=1,
                       shard_info=seqio.ShardInfo(i, 2))[0] for i in range(2)]
    assert not np.array_equal(shards[0]["encoder_input_tokens"],
                              shards[1]["encoder_input_tokens"])


def test_finetuning_shuffles_a_label_sorted_split_whole(data_dir, tmp_path, monkeypatch):
    # The prepared sentiment train split lists every positive sentence before the negatives;
    # a 1000-example shuffle buffer fed 20 batches of 32 positives first. Every block of 320
    # training examples (both classes and several tasks' formats) must hold both labels.
    import tasks_testdata
    from t5lite.tasks import pipeline
    root = tasks_testdata.label_sorted_data_dir(str(tmp_path / "sorted"), "train", 4000)
    monkeypatch.setenv("T5LITE_DATA_DIR", root)
    for name in ("sentiment", "sentiment_cls"):
        ds = pipeline.get_mixture_or_task(name).get_dataset(
            {"inputs": 16, "targets": 4}, split="train", shuffle=True, seed=0, num_epochs=1)
        key = "targets_pretokenized" if name == "sentiment" else "class_labels"
        labels = np.array([ex[key] for ex in ds.as_numpy_iterator()])
        assert len(labels) == 4000
        positive = labels == (b"positive" if name == "sentiment" else 1)
        blocks = positive[:3840].reshape(12, 320).mean(axis=1)
        assert ((blocks > 0.35) & (blocks < 0.65)).all(), (name, blocks.round(2))


def test_finetuning_shuffle_buffer_is_the_splits_size_at_most(data_dir, monkeypatch):
    # seqio repeats a training split before it shuffles: a buffer over the split's size held
    # copies of it (the 300-line sentiment split, 218 of them before the first batch)
    import tensorflow as tf
    from t5lite.tasks import pipeline
    sizes = []
    shuffle = tf.data.Dataset.shuffle

    def recorded(ds, buffer_size, *args, **kwargs):
        sizes.append(int(buffer_size))
        return shuffle(ds, buffer_size, *args, **kwargs)

    monkeypatch.setattr(tf.data.Dataset, "shuffle", recorded)
    lines = {}
    for name in ("sentiment", "topic_debian"):
        with open(os.path.join(data_dir, "finetune", name, "train.tsv")) as f:
            lines[name] = sum(1 for _ in f)
    _batches("sentiment", "encoder_decoder", {"inputs": 64, "targets": 8}, n=1)
    assert sizes[-1] == lines["sentiment"]  # (the first: seqio shuffling the one file)
    sizes.clear()
    task = pipeline.get_mixture_or_task("topic_debian")
    monkeypatch.setattr(task, "_shuffle_buffer_size", lines["topic_debian"] // 4)
    _batches("topic_debian", "encoder_decoder", {"inputs": 64, "targets": 8}, n=1)
    assert sizes[-1] == lines["topic_debian"] // 4  # a split over the task's buffer: the buffer


def test_eval_epoch_is_finite(data_dir):
    batches = _batches("sentiment", "encoder_decoder", {"inputs": 64, "targets": 8}, n=100,
                       split="validation", num_epochs=1, shuffle=False, pack=False,
                       drop_remainder=False)
    assert sum(len(b["encoder_input_tokens"]) for b in batches) == 30


def test_mixture_rates_and_sampling(data_dir):
    from t5lite.tasks import registry
    mix = seqio.get_mixture_or_task("finetune_local")
    rate = {t.name: mix.get_rate(t) for t in mix.tasks}
    assert rate["sentiment"] == 300 and rate["topic_debian"] == 100  # min(N, 2**16)
    mix_t = seqio.get_mixture_or_task("finetune_local_temperature")
    assert mix_t.get_rate(seqio.get_mixture_or_task("sentiment")) == pytest.approx(300 ** 0.5)
    mix_e = seqio.get_mixture_or_task("finetune_local_equal")
    assert {mix_e.get_rate(t) for t in mix_e.tasks} == {1.0}
    capped = registry.register_mixture("test_capped", ["sentiment", "topic_debian"],
                                       "proportional", cap=150)
    assert [capped.get_rate(t) for t in capped.tasks] == [150, 100]
    registry.register_mixture("test_mix", ["sentiment", "topic_debian"], "proportional")
    ds = seqio.get_mixture_or_task("test_mix").get_dataset(
        {"inputs": 64, "targets": 8}, split="train", shuffle=True, seed=0, num_epochs=None)
    vocab = seqio.get_mixture_or_task("sentiment").output_features["targets"].vocabulary
    labels = {tuple(vocab.encode(w)) + (1,) for w in ("positive", "negative")}
    sentiment = sum(tuple(ex["targets"]) in labels for ex in ds.take(800).as_numpy_iterator())
    assert abs(sentiment / 800 - 0.75) < 0.05


def test_every_local_finetune_task_reads(data_dir):
    from t5lite.tasks import registry
    for name, (prefix, fns, _) in registry.FINETUNE.items():
        task = seqio.get_mixture_or_task(name)
        ex = next(task.get_dataset({"inputs": 64, "targets": 16}, split="validation",
                                   shuffle=False).as_numpy_iterator())
        assert ex["inputs_pretokenized"].decode().startswith(prefix + " ")
        assert ex["targets"][-1] == 1  # EOS
        target = ex["targets_pretokenized"].decode()
        for fn in task.metric_fns:
            assert max(fn([target], [target]).values()) == pytest.approx(100.0)


def test_task_listing(data_dir):
    from t5lite.tasks import registered
    table = registered.list_tasks()
    assert "corpus_span_corruption" in table and "finetune_local" in table
    shown = registered.show_task("sentiment", split="validation", num_examples=2)
    assert shown.count("--- example") == 2 and "sst2 sentence:" in shown
    shown = registered.show_task("corpus_span_corruption", num_examples=1)
    assert "<extra_id_0>" in shown


def test_user_example_task(data_dir, tmp_path, monkeypatch):
    for src, dst in (("finetune/sentiment/train.tsv", "train.tsv"),
                     ("finetune/sentiment/validation.tsv", "dev.tsv"),
                     ("corpus/train.txt", "corpus.txt")):
        shutil.copy(os.path.join(data_dir, src), tmp_path / dst)
    monkeypatch.setenv("MY_DATA", str(tmp_path))
    sys.modules.pop("example_user_task", None)
    importlib.import_module("example_user_task")
    b = _batches("my_reviews", "encoder_decoder", {"inputs": 64, "targets": 8}, n=1,
                 split="validation", num_epochs=1)[0]
    assert set(b) == ENC_DEC
    b = _batches("my_corpus_denoising", "encoder_decoder", {"inputs": 128, "targets": 128},
                 n=1)[0]
    # 50% noise in spans of 10: the targets hold about as many tokens as the inputs.
    ratio = (b["decoder_target_tokens"] > 0).sum() / (b["encoder_input_tokens"] > 0).sum()
    assert 0.7 < ratio < 1.3


def test_task_modules_from_config(data_dir, tmp_path, monkeypatch):
    """data.task_modules: a user's registering module, by path or by name from the current
    directory, imported once (a second import would re-register and fail in seqio)."""
    (tmp_path / "c.txt").write_text("a line of text\n" * 4)  # read by the pre-flight
    from t5lite import config as config_lib
    from t5lite.errors import UserError
    from t5lite.tasks import pipeline
    from t5lite.train import trainer
    for name in ("by_path", "by_name"):
        (tmp_path / f"{name}_tasks.py").write_text(
            "import seqio\nfrom t5lite.tasks import registry, vocabularies\n"
            f"registry.register_pretraining_task('{name}_lm_task', 'lm', "
            f"source=seqio.TextLineDataSource({{'train': '{tmp_path}/c.txt', "
            f"'validation': '{tmp_path}/c.txt'}}))\n")
    monkeypatch.chdir(tmp_path)
    for modules, task in (((str(tmp_path / "by_path_tasks.py"),), "by_path_lm_task"),
                          (("by_name_tasks",), "by_name_lm_task")):
        cfg = config_lib.load_config("tiny_gpt_lm", [f"data.task_modules={modules!r}",
                                                     f"data.mixture_or_task={task}",
                                                     "train.prepare_data=()"])
        for _ in range(2):
            trainer.prepare_tasks(cfg)
        assert task in seqio.TaskRegistry.names()
    with pytest.raises(UserError, match="task_modules.*no_such_module"):
        pipeline.import_task_modules(["no_such_module"])
    with pytest.raises(UserError, match="missing.py"):
        pipeline.import_task_modules([str(tmp_path / "missing.py")])
