"""The finetuning tasks of Narang et al. 2021 ("Do Transformer Modifications Transfer...",
Table 1) that the T5 paper lacks, from TFDS, as that paper's code defines them
(google-research transformer_modifications/tasks.py: xsum_v110, web_questions_open_envocab):

  paper_xsum:           XSum (TFDS xsum:1.1.0, train / validation / test), T5's summarize:
                        "summarize: <document>" -> the one-sentence summary; ROUGE as T5
                        scores it (metrics.rouge); the paper's column is ROUGE-2.
  paper_web_questions:  closed-book WebQuestions (TFDS web_questions:1.0.0: train and test
                        only), T5's closed-book QA format (google-research t5_closed_book_qa
                        web_questions_open): "wq question: <question>" -> its first answer,
                        no context; exact match and F1 against any of its answers after
                        SQuAD's normalisation (metrics.squad, T5's squad metric); the paper's
                        column is exact match.

WebQuestions has no validation split. As the paper's code (and ORQA), its train split's
first 3,417 questions train and the last 361 (train[3417:]) are the validation split the
table reports; test is TFDS's test.
"""

from __future__ import annotations

import functools
from typing import Sequence, Union

import seqio
import tensorflow as tf

from t5lite.tasks import formats, metrics

TFDS = {"xsum": "xsum:1.1.0", "web_questions": "web_questions:1.0.0"}
WEBQ_TRAIN_EXAMPLES = 3417  # the train split's questions trained on; the rest validate
WEBQ_SPLITS = {"train": f"train[:{WEBQ_TRAIN_EXAMPLES}]",
               "validation": f"train[{WEBQ_TRAIN_EXAMPLES}:]", "test": "test"}
TASKS = ("paper_xsum", "paper_web_questions")


def web_questions_text(dataset):
    """WebQuestions -> "wq question: Q" -> its first answer (``answers`` kept for the metric:
    metrics.qa_answers scores a prediction against every one)."""
    def fmt(x):
        return {"inputs": tf.strings.join(["wq question:", x["question"]], " "),
                "targets": x["answers"][0], "answers": x["answers"]}
    return dataset.map(fmt, num_parallel_calls=tf.data.AUTOTUNE)


def benchmarks() -> dict:
    """task name -> (TFDS source, text preprocessors, postprocess_fn), as
    formats.register_paper_task takes them."""
    return {
        "paper_xsum": (
            seqio.TfdsDataSource(TFDS["xsum"], splits=["train", "validation", "test"]),
            [functools.partial(formats.summarize_text, article_key="document",
                               summary_key="summary")], None),
        "paper_web_questions": (
            seqio.TfdsDataSource(TFDS["web_questions"], splits=WEBQ_SPLITS),
            [web_questions_text], metrics.qa_answers)}


def register_paper_task(name: str, vocabulary: Union[str, seqio.Vocabulary],
                        metric_names: Sequence[str]) -> str:
    """One of TASKS (a task_catalog benchmark spec) with its catalog metrics."""
    return formats.register_paper_task(name, vocabulary, metric_names, benchmarks())
