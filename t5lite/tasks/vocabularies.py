"""The four vocabularies as seqio.Vocabulary objects: `get_vocabulary(name)`.

- t5lite_sp8k: t5lite's own 8,000-piece unigram SentencePiece (T5 conventions: pad 0, eos 1,
  unk 2, no bos, byte fallback) + 100 sentinels = 8,100 ids.
- t5: the real T5 32k SentencePiece + 100 sentinels = 32,100 ids (the T5 checkpoints' 32,128
  rows include 28 unused ones).
- gpt2: GPT-2's byte-level BPE (50,257 ids, eos = <|endoftext|> 50256) through tiktoken.
- cc_en: Narang et al. 2021's English-only 32k SentencePiece + 100 sentinels (the
  transformer_modifications tasks' vocabulary), read from its gs://t5-data URL at first use.
- bert: BERT uncased WordPiece (30,522 ids) through tensorflow_text.BertTokenizer; eos is
  [SEP]; cls_id / sep_id / mask_id are exposed for the BERT objectives.

Construction is cheap and reads nothing (tasks are registered at import time); the files under
the data dir are read on first use, which raises a UserError naming the `t5lite data prepare`
command when they are missing. Objects pickle without their loaded state.
"""

from __future__ import annotations

import functools
import json
from typing import Optional

import numpy as np
import seqio
import tensorflow as tf

from t5lite import dataprep
from t5lite.errors import UserError


class LocalSentencePieceVocabulary(seqio.SentencePieceVocabulary):
    """seqio's SentencePieceVocabulary whose model file is found in the data dir on first use."""

    def __init__(self, rel_path: str, prepare_name: str, extra_ids: int = 100):
        super().__init__("", extra_ids=extra_ids)
        self._rel_path, self._prepare_name = rel_path, prepare_name

    @property
    def sentencepiece_model_file(self) -> str:
        return dataprep.require(self._prepare_name, self._rel_path)

    def _model_context(self):
        # Reload when the data dir changed since the model was loaded (a process that moves
        # $T5LITE_DATA_DIR, e.g. tests, would otherwise keep the first dir's vocabulary).
        root = dataprep.data_dir()
        if self._model is None or getattr(self, "_loaded_from", None) != root:
            self._model = None
            self._sentencepiece_model_file = self.sentencepiece_model_file
            self._loaded_from = root
        return super()._model_context()

    def __eq__(self, other):
        return (type(other) is type(self) and other._rel_path == self._rel_path
                and other.extra_ids == self.extra_ids)

    def __hash__(self):
        return hash((self._rel_path, self.extra_ids))


# Narang et al. 2021's vocabulary: google-research transformer_modifications/
# transformer_modifications/tasks.py :34 (EN_VOCAB_SPM_PATH), with 100 extra ids (:40-41,
# EN_VOCAB_EXTRA_100) for every task the paper pretrains and finetunes on but WMT (:35, a 37k
# one that "only resides in CNS")
CC_EN_PATH = "gs://t5-data/vocabs/cc_en.32000/sentencepiece.model"


class RemoteSentencePieceVocabulary(seqio.SentencePieceVocabulary):
    """seqio's SentencePieceVocabulary for a model file at a URL (gs://), read with
    tf.io.gfile at first use, as C4 is (never at import or construction: tasks register it
    with no network); a UserError naming the URL when it cannot be read."""

    def _model_context(self):
        if self._model is None:
            try:
                return super()._model_context()
            except Exception as e:  # noqa: BLE001 - tf.io.gfile raises many error types
                detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise UserError(
                    f"cannot read the SentencePiece vocabulary {self._sentencepiece_model_file}"
                    f" ({type(e).__name__}: {detail}); it is read from there at run time: "
                    "run where gs://t5-data is reachable, or set data.paper_vocabulary=t5."
                ) from None
        return super()._model_context()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used in encoder.json / vocab.bpe."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


class GPT2Vocabulary(seqio.Vocabulary):
    """GPT-2 byte-level BPE (tiktoken, built from the local encoder.json / vocab.bpe).

    Text is encoded literally (a '<|endoftext|>' string in the data is not the eos token).
    GPT-2 has no pad token: seqio pads with 0, which is also '!', so rely on loss weights /
    segment ids and on eos when decoding; decoding stops at the first eos.
    """

    EOS = 50256

    def __init__(self, extra_ids: int = 0):
        super().__init__(extra_ids=extra_ids)
        self._enc = None

    def __getstate__(self):
        return {"_extra_ids": self._extra_ids, "_enc": None}

    @property
    def encoding(self):
        if self._enc is None:
            import tiktoken
            path = dataprep.require("vocab_gpt2", "vocab/gpt2/encoder.json")
            with open(path, encoding="utf-8") as f:
                encoder = json.load(f)
            byte_of = {c: b for b, c in _bytes_to_unicode().items()}
            ranks = {bytes(byte_of[c] for c in tok): i for tok, i in encoder.items()
                     if tok != "<|endoftext|>"}
            self._enc = tiktoken.Encoding("gpt2_t5lite", pat_str=GPT2_PATTERN,
                                          mergeable_ranks=ranks,
                                          special_tokens={"<|endoftext|>": self.EOS})
        return self._enc

    @property
    def eos_id(self) -> int:
        return self.EOS

    @property
    def bos_id(self) -> Optional[int]:
        return None

    @property
    def unk_id(self) -> Optional[int]:
        return None

    @property
    def _base_vocab_size(self) -> int:
        return self.EOS + 1

    def _encode(self, s: str) -> list[int]:
        return self.encoding.encode_ordinary(s)

    def _decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.EOS in ids:
            ids = ids[:ids.index(self.EOS)]
        return self.encoding.decode([i for i in ids if 0 <= i < self.EOS])

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """Scalar string -> int32 [n]; 1-D strings -> int32 RaggedTensor [b, None]."""
        def encode(batch):
            toks = [self._encode(x.decode("utf-8")) for x in np.reshape(batch, [-1])]
            flat = np.fromiter((t for ts in toks for t in ts), dtype=np.int32)
            return flat, np.array([len(t) for t in toks], dtype=np.int64)

        s = tf.convert_to_tensor(s, tf.string)
        flat, lengths = tf.numpy_function(encode, [s], (tf.int32, tf.int64), stateful=False)
        flat.set_shape([None])
        if s.shape.rank == 0:
            return flat
        return tf.RaggedTensor.from_row_lengths(flat, tf.reshape(lengths, [-1]))

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """int [..., n] -> string [...]."""
        def decode(arr):
            rows = np.reshape(arr, [-1, arr.shape[-1]])
            out = [self._decode(r.tolist()).encode("utf-8") for r in rows]
            return np.array(out, dtype=object).reshape(arr.shape[:-1])

        ids = tf.convert_to_tensor(ids)
        out = tf.numpy_function(decode, [ids], tf.string, stateful=False)
        out.set_shape(ids.shape[:-1])
        return out

    def __eq__(self, other):
        return type(other) is type(self) and other.extra_ids == self.extra_ids

    def __hash__(self):
        return hash(("gpt2", self.extra_ids))


class BertVocabulary(seqio.Vocabulary):
    """BERT uncased WordPiece through tensorflow_text.BertTokenizer, so tokenisation runs
    inside tf.data. eos is [SEP]; decoding drops [PAD], [CLS], [SEP].

    Uncasing is done as BERT's reference tokenizer does it (lowercase, NFD, drop accents):
    tf_text's own lower_case=True case-folds, which turns 'ß' into 'ss' and changes ids.
    """

    PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
    SIZE = 30522

    def __init__(self):
        super().__init__(extra_ids=0)
        self._tok = None

    def __getstate__(self):
        return {"_extra_ids": 0, "_tok": None}

    @property
    def vocab_file(self) -> str:
        return dataprep.require("vocab_bert", "vocab/bert/vocab.txt")

    @property
    def tf_tokenizer(self):
        if self._tok is None:
            import tensorflow_text as tf_text
            path = self.vocab_file
            with tf.init_scope():  # the lookup table must live outside any traced function
                self._tok = tf_text.BertTokenizer(path, token_out_type=tf.int64)
        return self._tok

    cls_id = property(lambda self: self.CLS)
    sep_id = property(lambda self: self.SEP)
    mask_id = property(lambda self: self.MASK)
    eos_id = property(lambda self: self.SEP)
    unk_id = property(lambda self: self.UNK)
    bos_id = property(lambda self: None)
    _base_vocab_size = property(lambda self: self.SIZE)

    def _encode(self, s: str) -> list[int]:
        return self._encode_tf(tf.constant(s)).numpy().tolist()

    def _decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if not ids:
            return ""
        return self._decode_tf(tf.constant(ids, tf.int32)).numpy().decode("utf-8")

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """Scalar string -> int32 [n]; 1-D strings -> int32 RaggedTensor [b, None]."""
        import tensorflow_text as tf_text
        s = tf.convert_to_tensor(s, tf.string)
        text = tf_text.normalize_utf8(tf.strings.lower(tf.reshape(s, [-1]), encoding="utf-8"),
                                      "NFD")
        text = tf.strings.regex_replace(text, r"\p{Mn}", "")
        toks = self.tf_tokenizer.tokenize(text)  # [b, words, pieces]
        toks = tf.cast(toks.merge_dims(1, 2), tf.int32)
        return toks.flat_values if s.shape.rank == 0 else toks

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """int [n] -> string scalar; int [b, n] -> string [b]. Words joined by spaces."""
        ids = tf.convert_to_tensor(ids)
        rank1 = ids.shape.rank == 1
        ids2 = tf.cast(tf.reshape(ids, [-1, tf.shape(ids)[-1]]), tf.int64)
        keep = (ids2 != self.PAD) & (ids2 != self.CLS) & (ids2 != self.SEP)
        words = self.tf_tokenizer.detokenize(tf.ragged.boolean_mask(ids2, keep))
        text = tf.strings.reduce_join(words, axis=-1, separator=" ")
        return text[0] if rank1 else text

    def __eq__(self, other):
        return type(other) is type(self)

    def __hash__(self):
        return hash("bert")


VOCABULARIES = ("t5lite_sp8k", "t5", "cc_en", "gpt2", "bert")


@functools.lru_cache(maxsize=None)
def get_vocabulary(name: str, extra_ids: Optional[int] = None) -> seqio.Vocabulary:
    """A shared, lazily loaded vocabulary. extra_ids defaults to 100 for the SentencePiece
    vocabularies (T5 sentinels) and 0 for gpt2; BERT has none."""
    if name == "t5lite_sp8k":
        return LocalSentencePieceVocabulary("vocab/t5lite_sp8k.model", "vocab_sp8k",
                                            100 if extra_ids is None else extra_ids)
    if name == "t5":
        return LocalSentencePieceVocabulary("vocab/t5_spiece.model", "vocab_t5",
                                            100 if extra_ids is None else extra_ids)
    if name == "cc_en":
        return RemoteSentencePieceVocabulary(CC_EN_PATH, 100 if extra_ids is None else extra_ids)
    if name == "gpt2":
        return GPT2Vocabulary(extra_ids or 0)
    if name == "bert":
        if extra_ids:
            raise UserError("the bert vocabulary has no extra ids; use [MASK] (mask_id).")
        return BertVocabulary()
    raise UserError(f"unknown vocabulary {name!r}; choose one of {', '.join(VOCABULARIES)}.")
