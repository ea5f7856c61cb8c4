"""The built-in tasks and mixtures as data: what `t5lite tasks list` shows, without seqio.

Importing t5lite.tasks registers every task with seqio, which imports TensorFlow (seconds), so
this table lives outside that package and imports nothing heavy. The tables the registration
iterates (vocabularies, finetuning sets, mixtures, the ablation variants) are defined here and
imported by t5lite/tasks/registry.py and ablation_tasks.py; tests/test_listings.py checks that
rows() equals what seqio's registries hold, so a task registered without its row here fails CI.
"""

from __future__ import annotations

import dataclasses

# vocabulary -> (task-name suffix, `tasks list` column, dataset that prepares it)
VOCABS = {
    "t5lite_sp8k": ("", "t5lite_sp8k.model", "vocab_sp8k"),
    "t5": ("_t5", "t5_spiece.model", "vocab_t5"),
    "gpt2": ("_gpt2", "GPT2Vocabulary", "vocab_gpt2"),
    "bert": ("_bert", "BertVocabulary", "vocab_bert"),
}
DEFAULT_VOCAB = "t5lite_sp8k"
VOCAB_SUFFIX = {name: v[0] for name, v in VOCABS.items()}

# feature layout of a pretraining objective -> the task's output features
LAYOUT_FEATURES = {
    "encdec": ("inputs", "targets"),
    "prefix": ("inputs", "targets"),
    "lm": ("targets",),
    "bert": ("inputs", "targets", "loss_weights"),
    "bert_nsp": ("inputs", "targets", "loss_weights", "token_type_ids", "nsp_labels"),
    "bert_span": ("inputs", "targets", "loss_weights", "span_left", "span_right",
                  "span_offset"),
}
# registry.OBJECTIVES (preprocessors, layout, description) -> corpus_<objective>: the layouts
# again here, as the listing needs them without seqio (the catalog test compares the two)
OBJECTIVE_LAYOUTS = {
    "span_corruption": "encdec", "iid_denoising": "encdec", "bert_denoising": "encdec",
    "mass_denoising": "encdec", "drop_tokens": "encdec", "deshuffling": "encdec",
    "prefix_lm": "prefix", "lm": "lm", "iid_denoising_lm": "lm", "mlm": "bert_nsp",
    "mlm_only": "bert", "spanbert": "bert_span",
}
# BART's noising (objectives.bart_denoising): corpus_<name> and, for --scale paper, c4_<name>
BART_OBJECTIVES = ("bart_infilling", "bart_permutation", "bart_deletion", "bart_rotation",
                   "bart_masking", "bart_infilling_permutation")
OBJECTIVE_LAYOUTS.update({name: "encdec" for name in BART_OBJECTIVES})
# corpus_<objective>_<vocab> registered besides corpus_<objective> (the default vocabulary)
OTHER_VOCAB_OBJECTIVES = {"t5": ("span_corruption", "iid_denoising", "prefix_lm"),
                          "gpt2": ("lm", "prefix_lm"), "bert": ("mlm", "mlm_only", "spanbert")}

# local finetuning set -> (text-to-text prefix, metric names in tasks/metrics.py, label names)
FINETUNE = {
    "sentiment": ("sst2 sentence:", ("accuracy",), ("negative", "positive")),
    "translate_en_de": ("translate English to German:", ("bleu",), None),
    "summarize_debian": ("summarize:", ("rouge",), None),
    "topic_debian": ("topic:", ("accuracy",), None),
    "topic_brown": ("genre:", ("accuracy",), None),
}
FINETUNE_VOCABS = ("t5lite_sp8k", "t5", "gpt2")
CLASSIFICATION_VOCABS = ("t5lite_sp8k", "bert")  # sentiment_cls[_bert] (encoder-only heads)
LOCAL_MIXTURES = {"finetune_local": "proportional", "finetune_local_temperature": "temperature",
                  "finetune_local_equal": "equal"}

# the T5 paper's ablation tables (ablation_tasks.py)
IID_RATES = (10, 25, 50)  # percent; 15 = corpus_iid_denoising
SPAN_LENGTHS = (2, 5, 10)  # mean span length; 3 = corpus_span_corruption
MULTITASK_K = (16, 17, 18, 19, 20, 21)  # the paper's log2 K
TEMPERATURES = (2, 4, 8)
MULTITASK_BASE = "corpus_iid_denoising"
PAPER_MULTITASK_BASE = "c4_iid_denoising"
# objective variants registered on C4 for --scale paper (c4_<name>)
C4_OBJECTIVES = ("span_corruption", "iid_denoising", "bert_denoising", "mass_denoising",
                 "drop_tokens", "deshuffling", "prefix_lm", "lm", "iid_denoising_lm"
                 ) + BART_OBJECTIVES
# the paper's benchmarks (formats.register_paper_tasks, TFDS): task -> metric names
PAPER_GLUE_METRICS = {
    "cola": ("matthews_corrcoef",), "sst2": ("accuracy",), "mrpc": ("f1_binary", "accuracy"),
    "qqp": ("f1_binary", "accuracy"), "stsb": ("pearson_corrcoef", "spearman_corrcoef"),
    "mnli": ("accuracy",), "qnli": ("accuracy",), "rte": ("accuracy",), "wnli": ("accuracy",)}
PAPER_SUPERGLUE_METRICS = {
    "boolq": ("accuracy",), "cb": ("accuracy", "f1_macro"), "copa": ("accuracy",),
    "multirc": ("f1_binary", "accuracy"), "rte": ("accuracy",), "wic": ("accuracy",),
    "wsc": ("accuracy",), "record": ("squad",)}
PAPER_OTHER_METRICS = {"paper_squad": ("squad",), "paper_cnn_dailymail": ("rouge",),
                       "paper_wmt_ende": ("bleu",), "paper_wmt_enfr": ("bleu",),
                       "paper_wmt_enro": ("bleu",)}


@dataclasses.dataclass(frozen=True)
class Row:
    """One task or mixture as `t5lite tasks list` shows it."""

    name: str
    kind: str  # task | mixture
    features: tuple  # sorted, as seqio keeps output_features
    vocabulary: str  # VOCABS column ("" for a mixture)
    metrics: tuple = ()  # a task's metric names
    members: tuple = ()  # a mixture's tasks, sorted
    needs: tuple = ()  # datasets `t5lite data prepare` builds for it

    def cells(self) -> list[str]:
        last = " + ".join(self.members) if self.kind == "mixture" else (
            ",".join(self.metrics) or "-")
        return [self.name, self.kind, ",".join(self.features), self.vocabulary, last]


def _task(name, features, vocab, metrics=(), source="") -> Row:
    _, column, dataset = VOCABS[vocab]
    return Row(name, "task", tuple(sorted(features)), column, tuple(metrics),
               needs=((source,) if source else ()) + (dataset,))


def paper_multitask_members() -> list[str]:
    return ([PAPER_MULTITASK_BASE] + [f"paper_glue_{t}" for t in PAPER_GLUE_METRICS]
            + [f"paper_super_glue_{t}" for t in PAPER_SUPERGLUE_METRICS]
            + list(PAPER_OTHER_METRICS))


def _task_rows() -> list[Row]:
    rows = []
    for objective, layout in OBJECTIVE_LAYOUTS.items():
        rows.append(_task(f"corpus_{objective}", LAYOUT_FEATURES[layout], DEFAULT_VOCAB,
                          source="corpus"))
    for vocab, objectives in OTHER_VOCAB_OBJECTIVES.items():
        for objective in objectives:
            rows.append(_task(f"corpus_{objective}{VOCAB_SUFFIX[vocab]}",
                              LAYOUT_FEATURES[OBJECTIVE_LAYOUTS[objective]], vocab,
                              source="corpus"))
    for dataset, (_, metrics, _) in FINETUNE.items():
        for vocab in FINETUNE_VOCABS:
            rows.append(_task(dataset + VOCAB_SUFFIX[vocab], ("inputs", "targets"), vocab,
                              metrics, source=dataset))
    for vocab in CLASSIFICATION_VOCABS:
        rows.append(_task("sentiment_cls" + VOCAB_SUFFIX[vocab], ("inputs", "class_labels"),
                          vocab, ("accuracy",), source="sentiment"))
    rows.append(_task("sentiment_cls_gpt2", ("targets", "class_labels"), "gpt2", ("accuracy",),
                      source="sentiment"))  # classification.py (decoder-only heads)
    for rate in IID_RATES:
        rows.append(_task(f"corpus_iid_denoising_rate{rate}", LAYOUT_FEATURES["encdec"],
                          DEFAULT_VOCAB, source="corpus"))
    for length in SPAN_LENGTHS:
        rows.append(_task(f"corpus_span_corruption_len{length}", LAYOUT_FEATURES["encdec"],
                          DEFAULT_VOCAB, source="corpus"))
    c4 = {f"c4_{o}": OBJECTIVE_LAYOUTS[o] for o in C4_OBJECTIVES}  # --scale paper: TFDS C4
    c4.update({f"c4_iid_denoising_rate{r}": "encdec" for r in IID_RATES})
    c4.update({f"c4_span_corruption_len{n}": "encdec" for n in SPAN_LENGTHS})
    rows += [_task(name, LAYOUT_FEATURES[layout], "t5") for name, layout in c4.items()]
    paper = {**{f"paper_glue_{t}": m for t, m in PAPER_GLUE_METRICS.items()},
             **{f"paper_super_glue_{t}": m for t, m in PAPER_SUPERGLUE_METRICS.items()},
             **PAPER_OTHER_METRICS}
    rows += [_task(name, ("inputs", "targets"), "t5", metrics) for name, metrics in paper.items()]
    return rows


def _mixture_members() -> dict[str, list[str]]:
    local = list(FINETUNE)
    mixtures = {name: local for name in LOCAL_MIXTURES}
    mixtures["pretrain_finetune_local"] = ["corpus_span_corruption"] + local
    multitask = [MULTITASK_BASE] + local
    paper = paper_multitask_members()
    for prefix, members in (("multitask", multitask), ("paper_multitask", paper)):
        mixtures.update({f"{prefix}_k{k}": members for k in MULTITASK_K})
        mixtures.update({f"{prefix}_temperature{t}": members for t in TEMPERATURES})
        mixtures[f"{prefix}_equal"] = members
    mixtures["paper_glue"] = [f"paper_glue_{t}" for t in PAPER_GLUE_METRICS]
    mixtures["paper_super_glue"] = [f"paper_super_glue_{t}" for t in PAPER_SUPERGLUE_METRICS]
    return mixtures


def rows() -> list[Row]:
    """Every built-in task (by name), then every mixture (by name)."""
    tasks = {r.name: r for r in _task_rows()}
    out = [tasks[n] for n in sorted(tasks)]
    for name, members in sorted(_mixture_members().items()):
        members = sorted(members)
        needs = tuple(dict.fromkeys(n for m in members for n in tasks[m].needs))
        out.append(Row(name, "mixture", tasks[members[0]].features, "", members=tuple(members),
                       needs=needs))
    return out
