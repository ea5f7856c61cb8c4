"""The SuperGLUE tasks the T5 paper does not cast as plain classification (TFDS features in,
text-to-text out; tasks/formats.py registers them, tasks/metrics.py scores them):

  wsc:    "wsc: Mark told Pete *he* was late." -> "Pete" (the candidate referent; the metric
          asks whether the model named it, and the label whether it is the referent)
  dpr:    the Definite Pronoun Resolution set in the same form, added to WSC's training
  record: "record query: Q entities: E1, E2 passage: P" -> an answer, one example per answer

This follows T5's wsc_simple / definite_pronoun_resolution_simple / record preprocessors
(t5/data/preprocessors.py), which the paper's Appendix D shows.
"""

from __future__ import annotations

import tensorflow as tf


def _mark_word_at(text, word, index):
    """text with the space-separated word at ``index`` written *word* (the word may carry
    punctuation after it: 'him,"'); unchanged when ``word`` is not there."""
    pattern = tf.strings.join([r"^((?:\S+ ){", tf.strings.as_string(index), r"})\Q", word,
                               r"\E\b"])
    return tf.strings.regex_replace(text, pattern, tf.strings.join([r"\1*", word, "*"]))


def mark_pronoun(text, pronoun, index):
    """WSC's text with its pronoun marked *pronoun* at its word index. Two WSC texts give the
    index one word off (T5 special-cases them), so the next and then the previous word are
    tried; a text where none holds the pronoun fails loudly rather than train unmarked."""
    marked = _mark_word_at(text, pronoun, index)
    for offset in (1, -1):
        marked = tf.cond(tf.equal(marked, text),
                         lambda o=offset: _mark_word_at(text, pronoun, tf.maximum(index + o, 0)),
                         lambda m=marked: m)
    check = tf.debugging.Assert(tf.not_equal(marked, text), ["WSC pronoun not found:", text])
    with tf.control_dependencies([check]):
        return tf.identity(marked)


def wsc_simple_text(dataset, positives_only: bool = False):
    """SuperGLUE WSC (TFDS wsc.fixed) -> {"inputs": "wsc: <text, pronoun *marked*>",
    "targets": the candidate noun (span1_text), "label", "idx"}. positives_only: keep only
    the examples whose candidate is the referent (training: the target is then the answer)."""
    if positives_only:
        dataset = dataset.filter(lambda x: tf.equal(x["label"], 1))

    def fmt(x):
        text = mark_pronoun(x["text"], x["span2_text"], tf.cast(x["span2_index"], tf.int32))
        return {"inputs": tf.strings.join(["wsc:", text], " "),
                "targets": x["span1_text"], "label": tf.cast(x["label"], tf.int32),
                "idx": tf.cast(x["idx"], tf.int32)}
    return dataset.map(fmt, num_parallel_calls=tf.data.AUTOTUNE)


def dpr_simple_text(dataset):
    """Definite Pronoun Resolution (TFDS definite_pronoun_resolution) -> "wsc: <sentence with
    the pronoun's first occurrence *marked*>" -> the right candidate noun."""
    def fmt(x):
        pattern = tf.strings.join([r" (\Q", x["pronoun"], r"\E)([ .,])"])
        sentence = tf.strings.regex_replace(x["sentence"], pattern, r" *\1*\2",
                                            replace_global=False)
        return {"inputs": tf.strings.join(["wsc:", sentence], " "),
                "targets": tf.gather(x["candidates"], tf.cast(x["label"], tf.int32))}
    return dataset.map(fmt, num_parallel_calls=tf.data.AUTOTUNE)


def record_text(dataset):
    """ReCoRD (TFDS) -> "record query: Q entities: E1, E2 passage: P" -> an answer: one
    example per answer (a query without answers, the test split's: one, "<unk>"), each with
    all the query's answers and its passage / query index, so that the metric can score each
    query once with the best of its answers (tasks/metrics.py record, record_squad)."""
    def fmt(x):
        passage = tf.strings.regex_replace(x["passage"], r"(\.|\?|\!|\"|\')\n@highlight\n",
                                           r"\1 ")
        passage = tf.strings.regex_replace(passage, r"\n@highlight\n", ". ")
        inputs = tf.strings.join(["record query:", x["query"], "entities:",
                                  tf.strings.reduce_join(x["entities"], separator=", "),
                                  "passage:", passage], " ")
        answers = x["answers"]
        n = tf.maximum(tf.size(answers), 1)
        targets = tf.cond(tf.size(answers) > 0, lambda: answers,
                          lambda: tf.constant(["<unk>"]))
        return {"inputs": tf.fill([n], inputs), "targets": targets,
                "answers": tf.repeat(tf.expand_dims(answers, 0), n, axis=0),
                "idx/passage": tf.fill([n], tf.cast(x["idx"]["passage"], tf.int32)),
                "idx/query": tf.fill([n], tf.cast(x["idx"]["query"], tf.int32))}
    return dataset.map(fmt).unbatch()


def official_records(rec: dict) -> list[dict]:
    """One line of an official SuperGLUE jsonl file -> its TFDS-style examples: a MultiRC
    passage with its questions and answer options -> one example per option, indexed by
    paragraph / question / answer (TFDS's "idx"); WSC's "target" spans -> top-level keys.
    Any other task's line is its one example."""
    if "passage" in rec and isinstance(rec["passage"], dict) and "questions" in rec["passage"]:
        return [{"paragraph": rec["passage"]["text"], "question": q["question"],
                 "answer": a["text"], "label": a["label"],
                 "idx": {"paragraph": rec["idx"], "question": q["idx"], "answer": a["idx"]}}
                for q in rec["passage"]["questions"] for a in q["answers"]]
    if "target" in rec:
        return [{**{k: v for k, v in rec.items() if k != "target"}, **rec["target"]}]
    return [rec]
