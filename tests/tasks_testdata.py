"""A small prepared data dir for the task tests (CONTRACTS.md layout), built in seconds.

Synthetic prose (deterministic), tiny finetuning TSVs, and a 600-piece SentencePiece model
trained on the prose and saved as vocab/t5lite_sp8k.model (so the registered tasks run).
"""

import os
import random

_WORDS = ("the a of to and in is was for that with as on by at from his her it be this which "
          "or an were are had have not but all they one their said there we been would has "
          "more will who if out so up no them into what about can than").split()


def _prose(rng: random.Random, vocab: list, n_docs: int) -> list:
    docs = []
    for _ in range(n_docs):
        sents = []
        for _ in range(rng.randint(1, 6)):
            words = [rng.choice(vocab) for _ in range(rng.randint(5, 20))]
            sents.append(" ".join(words).capitalize() + ".")
        docs.append(" ".join(sents))
    return docs


def make_data_dir(root: str) -> str:
    """Writes the data dir under root (once) and returns it."""
    done = os.path.join(root, ".done")
    if os.path.exists(done):
        return root
    import sentencepiece as spm
    rng = random.Random(0)
    nouns = ["".join(rng.choice("abcdefghiklmnoprstuvwy") for _ in range(rng.randint(3, 9)))
             for _ in range(300)]
    vocab = list(_WORDS) + nouns
    os.makedirs(os.path.join(root, "corpus"), exist_ok=True)
    docs = _prose(rng, vocab, 1600)
    for split, part in (("train", docs[:1500]), ("validation", docs[1500:])):
        with open(os.path.join(root, "corpus", f"{split}.txt"), "w") as f:
            f.write("\n".join(part) + "\n")
    labels = {"sentiment": ["positive", "negative"], "topic_debian": ["devel", "games", "net"],
              "topic_brown": ["news", "fiction"]}
    for name in ("sentiment", "translate_en_de", "summarize_debian", "topic_debian",
                 "topic_brown"):
        os.makedirs(os.path.join(root, "finetune", name), exist_ok=True)
        for split, n in (("train", {"sentiment": 300}.get(name, 100)), ("validation", 30),
                         ("test", 30)):
            with open(os.path.join(root, "finetune", name, f"{split}.tsv"), "w") as f:
                texts = ([" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 8)))
                          for _ in range(n)] if name == "sentiment" else _prose(rng, vocab, n))
                for text in texts:
                    if name in labels:
                        target = rng.choice(labels[name])
                    else:
                        target = " ".join(text.split()[:4])
                    f.write(f"{text}\t{target}\n")
    os.makedirs(os.path.join(root, "vocab"), exist_ok=True)
    # The label words are single pieces, as in the real 8k vocabulary (a 600-piece one would
    # spell "positive" in 7): a target is "▁" + the label + EOS, inside targets length 4.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(docs + [" ".join(sum(labels.values(), []))] * 200),
        model_prefix=os.path.join(root, "vocab", "t5lite_sp8k"),
        user_defined_symbols=sorted(set(sum(labels.values(), []))), vocab_size=600, model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        byte_fallback=True, num_threads=1, minloglevel=2)
    open(done, "w").close()
    return root


def label_sorted_data_dir(root: str, split: str, n: int) -> str:
    """A test data dir under root whose sentiment ``split`` holds n sentences, every positive
    one first (as the prepared file lists them); returns the data dir."""
    root = make_data_dir(root)
    with open(os.path.join(root, "finetune", "sentiment", f"{split}.tsv"), "w") as f:
        for i in range(n):
            f.write(f"sentence {i}\t{'positive' if i < n // 2 else 'negative'}\n")
    return root


def use_data_dir(root: str):
    """Point $T5LITE_DATA_DIR at a fresh test data dir; returns a function that restores it."""
    old = os.environ.get("T5LITE_DATA_DIR")
    os.environ["T5LITE_DATA_DIR"] = make_data_dir(root)

    def restore():
        if old is None:
            os.environ.pop("T5LITE_DATA_DIR", None)
        else:
            os.environ["T5LITE_DATA_DIR"] = old
    return restore
