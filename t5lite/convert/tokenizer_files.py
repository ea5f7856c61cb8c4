"""The tokenizer files an exported model needs, so that ``AutoTokenizer.from_pretrained(dir)``
encodes text to the ids t5lite trained on: SentencePiece (t5lite_sp8k, t5) as spiece.model +
tokenizer.json, BERT WordPiece as vocab.txt, GPT-2 BPE as vocab.json + merges.txt, each with
a tokenizer_config.json naming the class.

tokenizer.json is written for SentencePiece because transformers' T5Tokenizer rebuilds its
Unigram model without byte fallback: t5lite_sp8k's byte pieces would come back as <unk>. The
fast tokenizer mirrors transformers' T5 pipeline (precompiled normalizer, whitespace split,
metaspace) with the model's own byte fallback, sentinels <extra_id_i> at the ids seqio gives
them (extra_id_0 = the last id) and </s> appended, as t5lite's tasks append EOS to inputs.

The vocabulary is the one of the checkpoint's task (data.mixture_or_task, or eval.vocabulary
when set). Built-in tasks are looked up in task_catalog (no TensorFlow); other tasks through
their seqio registration.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Optional

from t5lite import dataprep, task_catalog
from t5lite.errors import UserError

# the built-in vocabularies' files in the data dir, and their ids before any padding rows
_FILES = {"t5lite_sp8k": ("vocab/t5lite_sp8k.model",), "t5": ("vocab/t5_spiece.model",),
          "gpt2": ("vocab/gpt2/encoder.json", "vocab/gpt2/vocab.bpe"),
          "bert": ("vocab/bert/vocab.txt",)}
_KIND = {"t5lite_sp8k": "sentencepiece", "t5": "sentencepiece", "gpt2": "gpt2", "bert": "bert"}
_SIZES = {"gpt2": 50257, "bert": 30522}
# vocab_size is the tokenizer's ids padded up to a multiple of 128 at most (HF T5: 32100 ids
# in 32128 rows); anything wider was trained on another vocabulary than the task's
_PADDING = 128


@dataclasses.dataclass(frozen=True)
class Vocab:
    """What the export copies: the vocabulary's kind, its files, its sentinels."""

    name: str  # t5lite vocabulary name, or the task's for a custom one
    kind: str  # sentencepiece | bert | gpt2
    files: tuple  # absolute paths
    extra_ids: int = 0


def find(cfg) -> tuple[Optional[Vocab], str]:
    """-> (the vocabulary of ``cfg``'s task, "") or (None, why no tokenizer can be written:
    no task, files not prepared here, a vocabulary without a tokenizer class, or one that does
    not fit model.vocab_size)."""
    if not hasattr(cfg, "data"):
        return None, "a bare ModelConfig names no task, hence no vocabulary"
    try:
        vocab = _vocabulary(cfg)
        size = ids_count(vocab) if vocab is not None else 0
    except UserError as e:
        return None, str(e).rstrip(".")
    if vocab is None:
        return None, (f"the vocabulary of {cfg.data.mixture_or_task!r} is neither "
                      "SentencePiece, BERT WordPiece nor GPT-2 BPE")
    v = cfg.model.vocab_size
    if not size <= v < size + _PADDING:
        return None, (f"model.vocab_size={v} does not fit the {size} ids of {vocab.name}, the "
                      f"vocabulary of {cfg.data.mixture_or_task!r} (set data.mixture_or_task "
                      "or eval.vocabulary to the model's own)")
    return vocab, ""


def _vocabulary(cfg) -> Optional[Vocab]:
    name = cfg.eval.vocabulary or _catalog_vocabulary(cfg.data.mixture_or_task)
    if not name:
        return _seqio_vocabulary(cfg)
    prepare = task_catalog.VOCABS[name][2]
    files = tuple(dataprep.require(prepare, rel, cfg.data.data_dir) for rel in _FILES[name])
    return Vocab(name, _KIND[name], files, 100 if _KIND[name] == "sentencepiece" else 0)


def ids_count(vocab: Vocab) -> int:
    if vocab.kind != "sentencepiece":
        return _SIZES[vocab.kind]
    return len(_sp_proto(vocab.files[0]).pieces) + vocab.extra_ids


def write(vocab: Vocab, out_dir: str, max_length: int) -> list[str]:
    """Writes the tokenizer files into out_dir; -> their names."""
    os.makedirs(out_dir, exist_ok=True)
    written, settings = {"sentencepiece": _write_sentencepiece, "bert": _write_bert,
                         "gpt2": _write_gpt2}[vocab.kind](vocab, out_dir)
    settings = {**_TOKENIZER_CONFIG[vocab.kind], **settings, "model_max_length": max_length}
    return sorted(written + [_write_json(out_dir, "tokenizer_config.json", settings)])


def special_ids(vocab: Vocab) -> dict:
    """config.json's token ids for transformers' generate(): the vocabulary's end and padding,
    where the family's defaults guess from vocab_size (GPT-2: its last row, a padding row
    once the embedding is padded to a multiple of 128)."""
    if vocab.kind == "gpt2":
        return {"bos_token_id": _SIZES["gpt2"] - 1, "eos_token_id": _SIZES["gpt2"] - 1}
    if vocab.kind == "bert":
        return {"pad_token_id": 0}
    spec = _sp_proto(vocab.files[0]).trainer_spec
    return {"eos_token_id": spec.eos_id, "pad_token_id": max(spec.pad_id, 0)}


def _catalog_vocabulary(name: str) -> str:
    """A built-in task's or mixture's vocabulary name; "" when not built in."""
    specs = {s.name: s.vocabulary for s in task_catalog.task_specs()}
    if name in specs:
        return specs[name]
    for m in task_catalog.mixture_specs():
        if m.name == name and m.members[0] in specs:
            return specs[m.members[0]]
    return ""


def _seqio_vocabulary(cfg) -> Optional[Vocab]:
    """A custom task's output vocabulary, read from its seqio registration."""
    import seqio

    from t5lite.tasks import pipeline, vocabularies
    dataprep.use_data_dir(cfg.data.data_dir)
    pipeline.import_task_modules(cfg.data.task_modules, cfg.data.task_module_files)
    task = pipeline.get_mixture_or_task(cfg.data.mixture_or_task)
    vocab = task.output_features["targets"].vocabulary
    name = cfg.data.mixture_or_task
    if isinstance(vocab, seqio.SentencePieceVocabulary):
        return Vocab(name, "sentencepiece", (vocab.sentencepiece_model_file,), vocab.extra_ids)
    for kind, cls in (("gpt2", vocabularies.GPT2Vocabulary),
                      ("bert", vocabularies.BertVocabulary)):
        if isinstance(vocab, cls):
            return Vocab(name, kind, tuple(dataprep.require(task_catalog.VOCABS[kind][2], rel)
                                           for rel in _FILES[kind]))
    return None


_TOKENIZER_CONFIG = {
    "sentencepiece": {},  # from the model's own pieces
    "bert": {"tokenizer_class": "BertTokenizer", "do_lower_case": True,
             "tokenize_chinese_chars": True, "strip_accents": None, "unk_token": "[UNK]",
             "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
             "mask_token": "[MASK]"},
    # GPT-2 has no pad token; t5lite pads with 0 and masks it out
    "gpt2": {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
             "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
             "add_prefix_space": False, "add_bos_token": False},
}


def _write_json(out_dir: str, name: str, obj: dict) -> str:
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    return name


def _copy(src: str, out_dir: str, name: str) -> str:
    shutil.copyfile(src, os.path.join(out_dir, name))
    return name


def _write_bert(vocab: Vocab, out_dir: str) -> tuple[list, dict]:
    return [_copy(vocab.files[0], out_dir, "vocab.txt")], {}


def _write_gpt2(vocab: Vocab, out_dir: str) -> tuple[list, dict]:
    return [_copy(vocab.files[0], out_dir, "vocab.json"),
            _copy(vocab.files[1], out_dir, "merges.txt")], {}


def _sp_proto(path: str):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def _write_sentencepiece(vocab: Vocab, out_dir: str) -> tuple[list, dict]:
    """spiece.model + tokenizer.json; the class is T5Tokenizer unless the model falls back to
    bytes, which only the generic fast class reads from tokenizer.json unchanged."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers import processors
    from tokenizers.models import Unigram

    proto = _sp_proto(vocab.files[0])
    spec = proto.trainer_spec
    if spec.model_type != 1:  # sentencepiece_model.proto: 1 = UNIGRAM
        raise UserError(f"{vocab.files[0]} is not a unigram SentencePiece model; export "
                        "writes tokenizers for unigram models (T5's kind) only.")
    tok = Tokenizer(Unigram([(p.piece, p.score) for p in proto.pieces], spec.unk_id,
                            spec.byte_fallback))
    if proto.normalizer_spec.precompiled_charsmap:
        tok.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
    metaspace = dict(replacement="\u2581", prepend_scheme="always", split=True)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(**metaspace)])
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(**metaspace)])
    # added in id order: <extra_id_{n-1}> first, so <extra_id_0> is the last id (seqio's)
    tok.add_special_tokens([AddedToken(f"<extra_id_{i}>", special=True)
                            for i in reversed(range(vocab.extra_ids))])
    eos = proto.pieces[spec.eos_id].piece
    tok.post_processor = processors.TemplateProcessing(
        single=["$A", eos], pair=["$A", eos, "$B", eos], special_tokens=[(eos, spec.eos_id)])
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cls = "PreTrainedTokenizerFast" if spec.byte_fallback else "T5Tokenizer"
    settings = {"tokenizer_class": cls, "extra_ids": vocab.extra_ids, "eos_token": eos,
                "unk_token": proto.pieces[spec.unk_id].piece,
                "pad_token": proto.pieces[spec.pad_id].piece if spec.pad_id >= 0 else eos}
    return [_copy(vocab.files[0], out_dir, "spiece.model"), "tokenizer.json"], settings
