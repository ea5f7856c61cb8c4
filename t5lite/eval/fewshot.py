"""In-context few-shot evaluation (GPT-3 style): k demonstrations from a task's train split,
then the example to label, scored by rank classification or by generation.

A prompt is ``separator.join(shot_1, ..., shot_k, query)`` where a shot is
``template.prompt.format(input=x) + template.answer.format(label=word(y))`` and the query is the
prompt part alone; ``word`` maps label names to label words (e.g. negative -> terrible). Shots
are drawn per scored example with ``numpy.random.default_rng((seed, example index))`` among the
train rows whose input differs from the scored one (no leakage, also when scoring the train
split). Prompts longer than the model's context keep their end (the query), losing the first
shots; the count of truncated prompts is reported.

Scoring: ``rank`` = the label whose answer has the highest log p(answer | prompt) (teacher
forced, decoding.make_score_fn through evaluation.Predictor); ``generate`` = decode with the
config's decode settings and compare the first line of the output with the label words. Works
for decoder-only / prefix LM (prompt = BOS + prompt, answer continues it) and encoder-decoder
(prompt = encoder input, answer = decoder target + EOS) checkpoints.
"""

from __future__ import annotations

import csv
import dataclasses
from typing import Sequence

import numpy as np

from t5lite.errors import UserError


@dataclasses.dataclass(frozen=True)
class Template:
    prompt: str  # with "{input}"
    answer: str = " {label}"  # with "{label}": the label word, scored / generated after prompt
    separator: str = "\n\n"  # between demonstrations and before the query


TEMPLATES = {
    "review": Template("Review: {input}\nAnswer:"),
    "input_answer": Template("Input: {input}\nAnswer:"),
    "it_was": Template("{input} It was", separator="\n"),
}
DEFAULT_TEMPLATE = {"sentiment": "review"}


def get_template(task: str, name: str = "") -> Template:
    """A TEMPLATES name, a literal prompt with "{input}" (answer " {label}"), or the task's
    default (DEFAULT_TEMPLATE, else "input_answer")."""
    name = name or DEFAULT_TEMPLATE.get(task, "input_answer")
    if name in TEMPLATES:
        return TEMPLATES[name]
    if "{input}" in name:
        return Template(name.replace("\\n", "\n"))
    raise UserError(f"--template {name!r}: use one of {', '.join(TEMPLATES)} or a prompt "
                    "containing {input}, e.g. 'Review: {input} Answer:'.")


def parse_label_words(spec: str, labels: Sequence[str]) -> dict:
    """"negative=terrible,positive=great" -> {label: word}; labels not named keep their name."""
    words = {label: label for label in labels}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        label, sep, word = item.partition("=")
        if not sep or label not in words or not word:
            raise UserError(f"--label-words {spec!r}: give LABEL=WORD pairs separated by commas "
                            f"with LABEL in {', '.join(labels)}.")
        words[label] = word
    if len(set(words.values())) < len(words):
        raise UserError(f"--label-words {spec!r}: two labels share a word.")
    return words


def read_split(task: str, split: str, data_dir: str = "") -> list[tuple[str, str]]:
    """(input, target) rows of a prepared finetuning dataset (CONTRACTS.md finetune TSVs)."""
    from t5lite import dataprep
    if task not in dataprep.finetune_names():
        raise UserError(f"few-shot evaluation reads a finetuning dataset; {task!r} is not one "
                        f"of {', '.join(dataprep.finetune_names())}.")
    path = dataprep.require(task, f"finetune/{task}/{split}.tsv", data_dir)
    with open(path, encoding="utf-8", newline="") as f:
        rows = [tuple(r[:2]) for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
                if len(r) >= 2]
    if not rows:
        raise UserError(f"{path} has no rows.")
    return rows


def sample_shots(train: Sequence[tuple[str, str]], k: int, seed: int, index: int,
                 query: str) -> list[int]:
    """k distinct train row indices for scored example `index`, none whose input is `query`."""
    if k <= 0:
        return []
    pool = [i for i, (x, _) in enumerate(train) if x != query]
    if len(pool) < k:
        raise UserError(f"--shots {k}: the train split has only {len(pool)} usable examples.")
    rng = np.random.default_rng((seed, index))
    return [pool[i] for i in rng.choice(len(pool), size=k, replace=False)]


def build_prompt(template: Template, shots: Sequence[tuple[str, str]], query: str,
                 words: dict) -> str:
    parts = [template.prompt.format(input=x) + template.answer.format(label=words[y])
             for x, y in shots]
    return template.separator.join(parts + [template.prompt.format(input=query)])


def labels(task: str, train) -> list[str]:
    """The task's label names (registry order), else the train split's distinct targets."""
    from t5lite.tasks import registry
    names = registry.FINETUNE.get(task, (None, None, None))[2]
    if names:
        return list(names)
    names = sorted({y for _, y in train})
    if len(names) > 100:
        raise UserError(f"{task!r} has {len(names)} distinct targets: not a classification "
                        "task; use --scoring generate.")
    return names


def evaluate_fewshot(predictor, in_vocab, out_vocab, task: str, train, examples, shots: int,
                     template: Template, words: dict, scoring: str = "rank",
                     seed: int = 0) -> dict:
    """{"task/accuracy", "task/majority_class", "task/truncated_prompts"} (percentages, count)
    and the per-example predictions under "predictions"."""
    labels = list(words)
    arch = predictor.arch
    eos = int(out_vocab.eos_id)
    # context budget: decoder-only rows hold BOS + prompt + answer (see evaluation.score_batch)
    budget = predictor.input_length
    prompts, truncated = [], 0
    for i, (x, _) in enumerate(examples):
        chosen = [train[j] for j in sample_shots(train, shots, seed, i, x)]
        ids = list(in_vocab.encode(build_prompt(template, chosen, x, words)))
        room = budget - (arch == "encoder_decoder")  # T5 inputs end with EOS
        if len(ids) > room:
            truncated += 1
            ids = ids[-room:]
        prompts.append(ids + [eos] if arch == "encoder_decoder" else ids)
    if scoring == "rank":
        answers = [list(out_vocab.encode(template.answer.format(label=words[y])))
                   + ([eos] if arch == "encoder_decoder" else []) for y in labels]
        lls = np.array(predictor.score([p for p in prompts for _ in labels],
                                       [a for _ in prompts for a in answers]))
        preds = [labels[int(i)] for i in lls.reshape(len(prompts), len(labels)).argmax(1)]
    elif scoring == "generate":
        by_word = {w.strip().lower(): y for y, w in words.items()}
        tokens, _ = predictor.predict(prompts)
        texts = [out_vocab.decode(predictor.strip(t)) for t in tokens]
        firsts = [(t.strip().splitlines() or [""])[0].strip().lower() for t in texts]
        preds = [by_word.get(f, by_word.get((f.split() or [""])[0], "")) for f in firsts]
    else:
        raise UserError(f"--scoring {scoring!r}: use rank or generate.")
    gold = [y for _, y in examples]
    n = len(gold)
    counts = {y: gold.count(y) for y in set(gold)}
    return {f"{task}/accuracy": 100.0 * sum(p == g for p, g in zip(preds, gold)) / n,
            f"{task}/majority_class": 100.0 * max(counts.values()) / n,
            f"{task}/truncated_prompts": float(truncated), "predictions": preds}
