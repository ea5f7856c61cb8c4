"""The pretraining data sets of the T5 paper's Tables 8 and 9 as seqio sources.

Table 8 pretrains on C4 (TFDS c4/en), its unfiltered, RealNews-like and WebText-like variants,
Wikipedia, and Wikipedia + the Toronto Books Corpus (the TFDS names are formats.TFDS). TFDS
has no Toronto Books Corpus: its text is the user's to provide (tbc_source), and reading
it without the files raises a UserError that says where to put them, when the first batch is
built, before any training step. TFDS's Wikipedia has one split; its last 1% is held out as
the validation split that pretraining evaluates on.

Table 9 pretrains on the first N tokens of C4 (FirstTokens): the first examples of the train
split in their stored order until they hold N tokens (the last may run past N), read once,
kept in memory (2^29 tokens of text: about 2 GB per host) and repeated for as long as
training runs. The cut is made before the examples are split between hosts, so the hosts
together see exactly those N tokens, whatever the shuffle seed or the number of hosts.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Union

import seqio
import tensorflow as tf

from t5lite import dataprep, task_catalog
from t5lite.errors import UserError
from t5lite.tasks import formats, registry, vocabularies

# FirstTokens shuffles its examples each epoch through a buffer this large: all of them for
# the smaller sizes (2^23 tokens of C4 are about 16k documents), far beyond seqio's 1,000
# (the task's own buffer, after preprocessing) for the largest
SHUFFLE_BUFFER = 2 ** 16


class _TbcFiles(Mapping):
    """split -> <data dir>/tbc/<split>.txt, checked when a dataset is built (the data dir may
    change after registration), with a message that says what to provide."""

    def __getitem__(self, split):
        root = dataprep.data_dir()
        path = os.path.join(root, "tbc", f"{split}.txt")
        if not os.path.exists(path):
            raise UserError(
                f"the Wikipedia + TBC row needs the Toronto Books Corpus, which TFDS does not "
                f"have: put its text, one paragraph per line, in {root}/tbc/train.txt and "
                f"{root}/tbc/validation.txt (data.data_dir / $T5LITE_DATA_DIR).")
        return path

    def __iter__(self):
        return iter(("train", "validation"))

    def __len__(self):
        return 2


def tbc_source() -> seqio.TextLineDataSource:
    """The Toronto Books Corpus as text lines the user provides (TFDS has none)."""
    return seqio.TextLineDataSource(split_to_filepattern=_TbcFiles())


def tfds_source(name: str) -> seqio.TfdsDataSource:
    """A TFDS pretraining set (a key of formats.TFDS) with a train and a validation split."""
    if name == "wikipedia":  # one split in TFDS: its last 1% is held out
        return seqio.TfdsDataSource(formats.TFDS[name], splits={
            "train": "train[:99%]", "validation": "train[99%:]"})
    return seqio.TfdsDataSource(formats.TFDS[name], splits=["train", "validation"])


def first_tokens(dataset, tokenize, max_tokens: int):
    """Whole examples from the first until they hold ``max_tokens`` tokens (the last may run
    past it, so that even a tiny budget keeps one example)."""
    def step(before, x):
        return before + tf.cast(tf.size(tokenize(x)), tf.int64), (before, x)
    taken = dataset.scan(tf.constant(0, tf.int64), step).take_while(
        lambda before, x: before < max_tokens)
    return taken.map(lambda before, x: x)


def _shard(dataset, shard_info: Optional[seqio.ShardInfo]):
    return dataset.shard(shard_info.num_shards, shard_info.index) if shard_info else dataset


class FirstTokens(seqio.DataSource):
    """``source`` with its train split cut to its first ``max_tokens`` tokens (by
    ``vocabulary``, as the task tokenizes them: first_tokens); the other splits whole. The
    module docstring says why the order, the sharding and the memory are as they are."""

    def __init__(self, source: seqio.DataSource, max_tokens: int,
                 vocabulary: Union[str, seqio.Vocabulary]):
        self._source, self.max_tokens = source, max_tokens
        self._vocabulary = (vocabularies.get_vocabulary(vocabulary)  # reads its file lazily
                            if isinstance(vocabulary, str) else vocabulary)
        # the cut comes before any sharding, so the seqio cache (`t5lite data cache`, one
        # shard per source file) holds the same N tokens
        super().__init__(splits=source.splits)

    @property
    def _split_to_filepattern(self):
        """The wrapped source's files, so that `tasks list` names the data set it reads."""
        return getattr(self._source, "_split_to_filepattern", None)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True

    def list_shards(self, split: str):
        return self._source.list_shards(split)

    def num_input_examples(self, split: str) -> Optional[int]:
        return None if split == "train" else self._source.num_input_examples(split)

    def get_dataset(self, split: str = "train", shuffle: bool = True, seed=None,
                    shard_info: Optional[seqio.ShardInfo] = None, **unused):
        if split != "train":
            if shard_info and not (self._source.supports_arbitrary_sharding or len(
                    self._source.list_shards(split)) >= shard_info.num_shards):
                return _shard(self._source.get_dataset(split, shuffle, seed), shard_info)
            return self._source.get_dataset(split, shuffle, seed, shard_info)
        dataset = self._source.get_dataset(split, shuffle=False)  # the stored order
        text = (lambda x: x["text"]) if isinstance(dataset.element_spec, dict) else (
            lambda x: x)
        dataset = first_tokens(dataset, lambda x: self._vocabulary.encode_tf(text(x)),
                               self.max_tokens).cache()
        dataset = _shard(dataset, shard_info)
        return dataset.shuffle(SHUFFLE_BUFFER, seed=seed) if shuffle else dataset


def pretraining_source(spec: task_catalog.TaskSpec,
                       vocabulary: Union[str, seqio.Vocabulary]) -> seqio.DataSource:
    """The source a catalog pretraining task reads: the local corpus, a TFDS set or the
    user's Toronto Books Corpus, cut to spec.max_tokens when that is set."""
    if spec.source == "corpus":
        source = registry.corpus_source()
    elif spec.source == "tbc":
        source = tbc_source()
    else:
        source = tfds_source(spec.source)
    return FirstTokens(source, spec.max_tokens, vocabulary) if spec.max_tokens else source


def gives_text_lines(spec: task_catalog.TaskSpec) -> bool:
    """Whether the source yields text lines (the local files) rather than {"text": ...}."""
    return spec.source in ("corpus", "tbc")
