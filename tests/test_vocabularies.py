"""Vocabularies: real T5 ids, GPT-2 / BERT parity with Hugging Face tokenizers built from the
same local files, use inside tf.data, laziness, pickling, and our own SentencePiece recipe."""

import json
import os
import pickle

import pytest
import tensorflow as tf

from t5lite import dataprep as D
from t5lite.errors import UserError
from t5lite.tasks import vocabularies as V

import tasks_testdata

TEXTS = [
    "translate English to German: Hello world",
    "It's a 3.5-star movie -- isn't it? I'd say they've won 1,000,000 dollars!!",
    "  Leading spaces,\ttabs\nand newlines   and  double  spaces. ",
    "Café naïve résumé Straße Ünïcödé; emoji \U0001F600 and CJK 日本語 text.",
    "def f(x): return x**2  # code-ish <tags> & {braces} [brackets] ~tilde~ @user #hash",
    "UPPER lower MiXeD CamelCaseWords and hyphen-ated-words, e.g. U.S.A. vs. USA.",
]


@pytest.fixture(scope="session")
def vocab_dir():
    return D.build.ensure_prepared(["vocab_t5", "vocab_gpt2", "vocab_bert"])


def _tf_roundtrip(vocab, texts):
    """encode_tf, then (eos appended, padded with 0) decode_tf inside tf.data pipelines."""
    ds = tf.data.Dataset.from_tensor_slices(texts).map(vocab.encode_tf)
    ids = [t.tolist() for t in ds.as_numpy_iterator()]
    dense = tf.ragged.constant([i + [vocab.eos_id] for i in ids], dtype=tf.int32).to_tensor()
    dec = tf.data.Dataset.from_tensor_slices(dense).map(vocab.decode_tf)
    return ids, [s.decode("utf-8") for s in dec.as_numpy_iterator()]


def test_t5_real_ids(vocab_dir):
    v = V.get_vocabulary("t5")
    assert v.encode("translate English to German: Hello world") == [
        13959, 1566, 12, 2968, 10, 8774, 296]
    assert (v.vocab_size, v.pad_id, v.eos_id, v.unk_id, v.extra_ids) == (32100, 0, 1, 2, 100)
    assert v.encode("<extra_id_0>") == [32099]
    ids, decoded = _tf_roundtrip(v, TEXTS[:2])
    assert ids[0] == v.encode(TEXTS[0]) and decoded[0] == TEXTS[0]


def test_gpt2_matches_hf(vocab_dir):
    from transformers import GPT2Tokenizer
    with open(os.path.join(vocab_dir, "vocab/gpt2/encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    with open(os.path.join(vocab_dir, "vocab/gpt2/vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(ln.split()) for ln in f.read().split("\n")[1:] if ln]
    hf = GPT2Tokenizer(vocab=encoder, merges=merges)
    v = V.get_vocabulary("gpt2")
    assert (v.vocab_size, v.eos_id, hf.eos_token_id) == (50257, 50256, 50256)
    assert v.encode("Hello world") == [15496, 995]
    for text in TEXTS:
        ours = v.encode(text)
        assert ours == hf(text, add_special_tokens=False)["input_ids"], text
        assert v.decode(ours) == text
    ids, decoded = _tf_roundtrip(v, TEXTS)
    assert ids == [v.encode(t) for t in TEXTS]
    assert decoded == TEXTS  # pad 0 is '!' in GPT-2: decoding stops at eos
    assert v.decode(v.encode("stop here") + [v.eos_id, 0, 0]) == "stop here"


def test_bert_matches_hf(vocab_dir):
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    hf = BertTokenizerLegacy(os.path.join(vocab_dir, "vocab/bert/vocab.txt"),
                             do_lower_case=True)
    v = V.get_vocabulary("bert")
    assert (v.vocab_size, v.pad_id, v.unk_id, v.eos_id) == (30522, 0, 100, 102)
    assert (v.cls_id, v.sep_id, v.mask_id) == (101, 102, 103)
    assert hf.convert_tokens_to_ids(["[CLS]", "[SEP]", "[MASK]", "the"]) == [101, 102, 103, 1996]
    for text in TEXTS:
        assert v.encode(text) == hf(text, add_special_tokens=False)["input_ids"], text
    ids, decoded = _tf_roundtrip(v, TEXTS)
    assert ids == [v.encode(t) for t in TEXTS]
    assert decoded[0] == "translate english to german : hello world"
    assert v.decode([101] + v.encode("Unaffable cafés") + [102, 0]) == "unaffable cafes"


def test_sp8k_follows_the_data_dir(tmp_path, monkeypatch):
    """The shared (cached) vocabulary object reloads its model when $T5LITE_DATA_DIR moves."""
    import shutil

    import sentencepiece as spm
    a = tasks_testdata.make_data_dir(str(tmp_path / "a"))
    b = str(tmp_path / "b")
    shutil.copytree(a, b)
    spm.SentencePieceTrainer.train(
        input=os.path.join(b, "corpus", "train.txt"),
        model_prefix=os.path.join(b, "vocab", "t5lite_sp8k"), vocab_size=300, pad_id=0,
        eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, minloglevel=2)
    v = V.get_vocabulary("t5lite_sp8k")
    sizes = []
    for root in (a, b, a):
        monkeypatch.setenv("T5LITE_DATA_DIR", root)
        sizes.append((v.vocab_size, v.encode("<extra_id_0>")))
    assert sizes == [(700, [699]), (400, [399]), (700, [699])]


def test_vocabularies_are_lazy_picklable_and_say_what_to_prepare(tmp_path, monkeypatch):
    monkeypatch.setenv("T5LITE_DATA_DIR", str(tmp_path))  # nothing prepared here
    fresh = [V.LocalSentencePieceVocabulary("vocab/t5lite_sp8k.model", "vocab_sp8k"),
             V.LocalSentencePieceVocabulary("vocab/t5_spiece.model", "vocab_t5"),
             V.GPT2Vocabulary(), V.BertVocabulary()]
    for v, name in zip(fresh, ["vocab_sp8k", "vocab_t5", "vocab_gpt2", "vocab_bert"]):
        assert pickle.loads(pickle.dumps(v)) == v
        with pytest.raises(UserError, match=f"t5lite data prepare {name}"):
            v.encode("hello")
    assert not os.listdir(tmp_path)  # using a vocabulary never prepares data
    with pytest.raises(UserError, match="unknown vocabulary"):
        V.get_vocabulary("t5_small")


def test_loaded_vocabulary_pickles_without_state(vocab_dir):
    for name in ("t5", "gpt2", "bert"):
        v = V.get_vocabulary(name)
        ids = v.encode("pickle me")
        w = pickle.loads(pickle.dumps(v))
        assert w == v and w.encode("pickle me") == ids


def test_sentencepiece_recipe_conventions_and_determinism(tmp_path):
    """Our training recipe (small vocab on a small real text) is deterministic and follows
    T5's conventions; byte fallback leaves no unknowns."""
    import sentencepiece as spm
    fetcher = D.fetch.Fetcher(os.path.join(D.datadir.data_dir(), "downloads"))
    path, _ = fetcher.fetch(D.fetch.SOURCES["sotu"])
    speeches = ("/1790_george_washington_n.txt", "/1861_abraham_lincoln_r.txt",
                "/1941_franklin_d_roosevelt_d.txt")
    texts = D.archives.read_members(path, lambda n: n.endswith(speeches))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(t.decode() for t in texts.values()) + "\n")
    models = []
    for i in range(2):
        m = str(tmp_path / f"sp{i}.model")
        D.vocab.train_sentencepiece(str(corpus), m, vocab_size=600, sample_percent=100)
        models.append(open(m, "rb").read())
    assert models[0] == models[1]
    sp = spm.SentencePieceProcessor(model_proto=models[0])
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id(), sp.get_piece_size()) == (
        0, 1, 2, -1, 600)
    ids = sp.encode("Fellow-Citizens 日本 ☃")
    assert 2 not in ids and sp.decode(ids) == "Fellow-Citizens 日本 ☃"


@pytest.mark.slow
def test_t5lite_sp8k_on_the_corpus():
    D.build.ensure_prepared(["vocab_sp8k"])
    v = V.get_vocabulary("t5lite_sp8k")
    assert (v.vocab_size, v.pad_id, v.eos_id, v.unk_id) == (8100, 0, 1, 2)
    assert v.encode("<extra_id_0>") == [8099]
    text = "The President addressed the Congress on the state of the Union."
    ids, decoded = _tf_roundtrip(v, [text])
    assert decoded == [text] and len(ids[0]) < 20
