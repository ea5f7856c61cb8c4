"""The built-in tasks and mixtures as data: the one definition of what t5lite registers with
seqio and what `t5lite tasks list` shows.

task_specs() and mixture_specs() expand the tables below into one spec per task and mixture;
t5lite/tasks/builtin.py registers exactly those specs (a new built-in task is a new table
entry here), and rows() shows them. Importing t5lite.tasks registers every task with seqio,
which imports TensorFlow (seconds), so the catalog lives outside that package and imports
nothing heavy. tests/test_listings.py checks that rows() equals what seqio's registries hold.
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
# pretraining objective (its preprocessors: registry.OBJECTIVE_STEPS) -> feature layout; each
# is registered as corpus_<objective> with the default vocabulary
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

# the T5 paper's ablation tables (tasks/ablation_tasks.py explains them)
IID_RATES = (10, 25, 50)  # percent; 15 = corpus_iid_denoising
SPAN_LENGTHS = (2, 5, 10)  # mean span length; 3 = corpus_span_corruption
MULTITASK_K = (16, 17, 18, 19, 20, 21)  # the paper's log2 K
TEMPERATURES = (2, 4, 8)
# the local sets are far smaller than the paper's, so Table 11's K is scaled for them
K_SCALE = 2.0 ** -5
MULTITASK_BASE = "corpus_iid_denoising"
PAPER_MULTITASK_BASE = "c4_iid_denoising"
# objective variants registered on C4 for --scale paper (c4_<name>)
C4_OBJECTIVES = ("span_corruption", "iid_denoising", "bert_denoising", "mass_denoising",
                 "drop_tokens", "deshuffling", "prefix_lm", "lm", "iid_denoising_lm"
                 ) + BART_OBJECTIVES
# Table 8's pretraining data sets, each with the baseline objective: TFDS ones (their names in
# tasks/formats.py TFDS) and "tbc", the Toronto Books Corpus, which TFDS lacks (text files the
# user provides: tasks/paper_data.py). <set>_iid_denoising has the t5 vocabulary (--scale
# paper; c4_iid_denoising is C4's), sp8k_<set>_iid_denoising the local scales' 8k one.
TFDS_DATA_SETS = ("c4", "c4_noclean", "c4_realnewslike", "c4_webtextlike", "wikipedia")
UNPREPARED_SOURCES = TFDS_DATA_SETS + ("tbc",)  # read as they are: no `t5lite data prepare`
# Wikipedia + TBC as one data set: each drawn by its share of the paper's 20GB (Table 8: 16GB
# of Wikipedia), as concatenating the two would
WIKIPEDIA_TBC = (("wikipedia_iid_denoising", 16.0), ("tbc_iid_denoising", 4.0))
# Table 9: C4 (paper) or the local corpus cut to its first 2^k tokens, for these k (the
# table's rows pick k from the tokens a scale trains on: configs/ablations/table9.py)
FIRST_TOKENS_LOG2 = tuple(range(7, 30))
# the paper's benchmarks (TFDS; their formats in tasks/formats.py): task -> metric names. Each
# is registered as paper_glue_<task> / paper_super_glue_<task>; what the paper trains on and
# how it scores them are the tables after these.
PAPER_GLUE_METRICS = {
    "cola": ("matthews_corrcoef",), "sst2": ("accuracy",), "mrpc": ("f1_binary", "accuracy"),
    "qqp": ("f1_binary", "accuracy"), "stsb": ("pearson_corrcoef", "spearman_corrcoef"),
    "mnli": ("accuracy",), "qnli": ("accuracy",), "rte": ("accuracy",), "wnli": ("accuracy",)}
# wsc: T5's "simple" WSC (the model names the pronoun's referent; accuracy of whether it names
# the candidate the label judges); wsc_train: its training examples, the positive ones only
# (their referent is the answer); dpr: the Definite Pronoun Resolution set in the same form,
# added to WSC's training as the paper did (T5's dpr_v001_simple)
PAPER_SUPERGLUE_METRICS = {
    "boolq": ("accuracy",), "cb": ("mean_3class_f1", "accuracy"), "copa": ("accuracy",),
    "multirc": ("multirc_f1a", "multirc_em"), "record": ("record_squad",),
    "rte": ("accuracy",), "wic": ("accuracy",), "wsc": ("accuracy",), "wsc_train": (),
    "dpr": ("sequence_accuracy",)}
# The paper's finetuning mixtures (T5's glue_v002_proportional and
# super_glue_v102_proportional): no WNLI (the paper neither trains on it nor reports it), MNLI
# trained once (its matched / mismatched sets are evaluation tasks), WSC as wsc_train + DPR.
PAPER_GLUE_TRAIN = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")
PAPER_SUPERGLUE_TRAIN = ("boolq", "cb", "copa", "multirc", "record", "rte", "wic",
                         "wsc_train", "dpr")
# The paper's GLUE and SuperGLUE scores: the mean over these groups of each group's mean metric
# (T5's eval_utils.compute_avg_glue). A group is one benchmark task: MRPC / QQP average F1 and
# accuracy, STS-B Pearson and Spearman, MNLI its matched and mismatched accuracy, CB its mean F1
# and accuracy, MultiRC F1a and exact match, ReCoRD F1 and EM; WNLI and DPR are in neither.
# The metric keys are "<evaluated task>/<metric>"; a group's tasks share one checkpoint when
# the best one is chosen per task (T5's metric_group_max).
PAPER_GLUE_SCORE = {
    "cola": ("paper_glue_cola/matthews_corrcoef",), "sst2": ("paper_glue_sst2/accuracy",),
    "mrpc": ("paper_glue_mrpc/f1", "paper_glue_mrpc/accuracy"),
    "stsb": ("paper_glue_stsb/pearson_corrcoef", "paper_glue_stsb/spearman_corrcoef"),
    "qqp": ("paper_glue_qqp/f1", "paper_glue_qqp/accuracy"),
    "mnli": ("paper_glue_mnli_matched/accuracy", "paper_glue_mnli_mismatched/accuracy"),
    "qnli": ("paper_glue_qnli/accuracy",), "rte": ("paper_glue_rte/accuracy",)}
PAPER_SUPERGLUE_SCORE = {
    "boolq": ("paper_super_glue_boolq/accuracy",),
    "cb": ("paper_super_glue_cb/mean_3class_f1", "paper_super_glue_cb/accuracy"),
    "copa": ("paper_super_glue_copa/accuracy",),
    "multirc": ("paper_super_glue_multirc/f1a", "paper_super_glue_multirc/em"),
    "record": ("paper_super_glue_record/f1", "paper_super_glue_record/em"),
    "rte": ("paper_super_glue_rte/accuracy",), "wic": ("paper_super_glue_wic/accuracy",),
    "wsc": ("paper_super_glue_wsc/accuracy",)}


def score_tasks(score: dict) -> tuple:
    """The tasks a score table evaluates, in its order: "paper_glue_cola", ..."""
    return tuple(dict.fromkeys(key.split("/")[0] for keys in score.values() for key in keys))


# MNLI is trained as paper_glue_mnli and evaluated as two tasks of its own, matched and
# mismatched (T5's glue_mnli_matched / _mismatched): TFDS has no plain validation / test split
MNLI_EVAL = ("matched", "mismatched")
PAPER_OTHER_METRICS = {"paper_squad": ("squad",), "paper_cnn_dailymail": ("rouge",),
                       "paper_wmt_ende": ("bleu",), "paper_wmt_enfr": ("bleu",),
                       "paper_wmt_enro": ("bleu",)}
# Narang et al. 2021's other finetuning tasks (tasks/narang_tasks.py), in none of the T5
# paper's mixtures: XSum and closed-book WebQuestions (SQuAD's EM and F1 over every answer)
NARANG_METRICS = {"paper_xsum": ("rouge",), "paper_web_questions": ("squad",)}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One built-in task: what tasks/builtin.py needs to register it.

    recipe: pretraining (``objective`` with ``options``, its keyword arguments, as pairs),
    finetune (text-to-text over a local set), classification ([CLS] input -> class_labels),
    decoder_classification (text -> class_labels, GPT heads) or benchmark (the paper's, from
    TFDS: tasks/formats.py). source: the local data set it reads (a `t5lite data prepare`
    name), one of UNPREPARED_SOURCES (TFDS_DATA_SETS, "tbc") or "" (a benchmark's own TFDS
    set). max_tokens: read only the source's first that many train tokens (Table 9). paper:
    registered for `--scale paper`, with a vocabulary that ablation_tasks.register_paper may
    change.
    """

    name: str
    recipe: str
    vocabulary: str
    source: str = ""
    objective: str = ""
    options: tuple = ()
    metrics: tuple = ()  # metric names in tasks/metrics.py
    paper: bool = False
    max_tokens: int = 0

    def features(self) -> tuple:
        if self.recipe == "pretraining":
            return LAYOUT_FEATURES[OBJECTIVE_LAYOUTS[self.objective]]
        return {"classification": ("inputs", "class_labels"),
                "decoder_classification": ("targets", "class_labels")}.get(
                    self.recipe, ("inputs", "targets"))


@dataclasses.dataclass(frozen=True)
class MixtureSpec:
    """One built-in mixture: its tasks and rate (registry.register_mixture's arguments)."""

    name: str
    members: tuple
    rate: str = "proportional"  # proportional | temperature | equal
    cap: int = 2 ** 16
    temperature: float = 2.0
    paper: bool = False
    weights: tuple = ()  # a fixed rate per member (instead of ``rate``)
    # ((member, rate), ...): these members at a fixed rate, the others at ``rate``
    fixed: tuple = ()


def _pretraining(name, objective, vocab=DEFAULT_VOCAB, **options) -> TaskSpec:
    return TaskSpec(name, "pretraining", vocab, "corpus", objective, tuple(options.items()))


def _c4(name, objective, source="c4", max_tokens=0, **options) -> TaskSpec:
    return TaskSpec(name, "pretraining", "t5", source, objective, tuple(options.items()),
                    paper=True, max_tokens=max_tokens)


def _data_set_specs() -> list[TaskSpec]:
    """Tables 8 and 9: the paper's pretraining data sets, and C4 / the corpus cut short."""
    sets = TFDS_DATA_SETS + ("tbc",)
    specs = [TaskSpec(f"sp8k_{d}_iid_denoising", "pretraining", DEFAULT_VOCAB, d,
                      "iid_denoising") for d in sets]
    specs += [_c4(f"{d}_iid_denoising", "iid_denoising", d) for d in sets if d != "c4"]
    for k in FIRST_TOKENS_LOG2:
        specs.append(TaskSpec(f"corpus_iid_denoising_tokens2pow{k}", "pretraining",
                              DEFAULT_VOCAB, "corpus", "iid_denoising", max_tokens=2 ** k))
        specs.append(_c4(f"c4_iid_denoising_tokens2pow{k}", "iid_denoising", max_tokens=2 ** k))
    return specs


def _local_task_specs() -> list[TaskSpec]:
    specs = [_pretraining(f"corpus_{o}", o) for o in OBJECTIVE_LAYOUTS]
    specs += [_pretraining(f"corpus_{o}{VOCAB_SUFFIX[vocab]}", o, vocab)
              for vocab, names in OTHER_VOCAB_OBJECTIVES.items() for o in names]
    specs += [TaskSpec(dataset + VOCAB_SUFFIX[vocab], "finetune", vocab, dataset,
                       metrics=metrics)
              for dataset, (_, metrics, _) in FINETUNE.items() for vocab in FINETUNE_VOCABS]
    specs += [TaskSpec("sentiment_cls" + VOCAB_SUFFIX[vocab], "classification", vocab,
                       "sentiment", metrics=("accuracy",)) for vocab in CLASSIFICATION_VOCABS]
    specs.append(TaskSpec("sentiment_cls_gpt2", "decoder_classification", "gpt2", "sentiment",
                          metrics=("accuracy",)))
    specs += [_pretraining(f"corpus_iid_denoising_rate{rate}", "iid_denoising",
                           noise_density=rate / 100) for rate in IID_RATES]
    specs += [_pretraining(f"corpus_span_corruption_len{length}", "span_corruption",
                           mean_noise_span_length=float(length)) for length in SPAN_LENGTHS]
    return specs + [s for s in _data_set_specs() if not s.paper]


def _paper_task_specs() -> list[TaskSpec]:
    specs = [_c4(f"c4_{o}", o) for o in C4_OBJECTIVES]
    specs += [_c4(f"c4_iid_denoising_rate{rate}", "iid_denoising", noise_density=rate / 100)
              for rate in IID_RATES]
    specs += [_c4(f"c4_span_corruption_len{length}", "span_corruption",
                  mean_noise_span_length=float(length)) for length in SPAN_LENGTHS]
    benchmarks = {**{f"paper_glue_{t}": m for t, m in PAPER_GLUE_METRICS.items()},
                  **{f"paper_glue_mnli_{s}": PAPER_GLUE_METRICS["mnli"] for s in MNLI_EVAL},
                  **{f"paper_super_glue_{t}": m for t, m in PAPER_SUPERGLUE_METRICS.items()},
                  **PAPER_OTHER_METRICS, **NARANG_METRICS}
    specs += [TaskSpec(name, "benchmark", "t5", metrics=metrics, paper=True)
              for name, metrics in benchmarks.items()]
    return specs + [s for s in _data_set_specs() if s.paper]


def task_specs() -> list[TaskSpec]:
    """Every built-in task: the local ones, then those for `--scale paper`."""
    return _local_task_specs() + _paper_task_specs()


def paper_multitask_members() -> list[str]:
    """Table 11's mixture: C4's unsupervised task and every task the paper finetunes on."""
    return ([PAPER_MULTITASK_BASE] + [f"paper_glue_{t}" for t in PAPER_GLUE_TRAIN]
            + [f"paper_super_glue_{t}" for t in PAPER_SUPERGLUE_TRAIN]
            + list(PAPER_OTHER_METRICS))


def multitask_members() -> list[str]:
    """Table 11's local multi-task mixture: the unsupervised task and every finetuning set."""
    return [MULTITASK_BASE] + list(FINETUNE)


def scaled_k(log2_k: int) -> int:
    return int(2 ** log2_k * K_SCALE)


def _multitask_specs(prefix: str, members: list, cap, paper: bool) -> list[MixtureSpec]:
    """Table 11's mixtures: examples-proportional at each K, temperature-scaled, equal."""
    members = tuple(members)
    return ([MixtureSpec(f"{prefix}_k{k}", members, "proportional", cap(k), paper=paper)
             for k in MULTITASK_K]
            + [MixtureSpec(f"{prefix}_temperature{t}", members, "temperature", cap(21),
                           float(t), paper=paper) for t in TEMPERATURES]
            + [MixtureSpec(f"{prefix}_equal", members, "equal", paper=paper)])


# Table 12: the examples-proportional multi-task mixture at K = 2^19 without one downstream
# task (leave-one-out: <prefix>_k19_without_<task>) or without the unsupervised task
# (supervised multi-task pre-training: <prefix>_supervised_k19). A paper-scale downstream
# task stands for all of its tasks (GLUE's, SuperGLUE's), as it is finetuned on all of them.
TABLE12_LOG2_K = 19
PAPER_DOWNSTREAM_PREFIXES = {
    "glue": "paper_glue_", "super_glue": "paper_super_glue_", "squad": "paper_squad",
    "cnn_dailymail": "paper_cnn_dailymail", "wmt_ende": "paper_wmt_ende",
    "wmt_enfr": "paper_wmt_enfr", "wmt_enro": "paper_wmt_enro"}


def _table12_specs(prefix: str, members: list, base: str, groups: dict, cap,
                   paper: bool) -> list[MixtureSpec]:
    """groups: downstream task -> the members it stands for (left out together)."""
    k = TABLE12_LOG2_K
    specs = [MixtureSpec(f"{prefix}_supervised_k{k}", tuple(m for m in members if m != base),
                         "proportional", cap(k), paper=paper)]
    specs += [MixtureSpec(f"{prefix}_k{k}_without_{task}",
                          tuple(m for m in members if m not in left), "proportional", cap(k),
                          paper=paper) for task, left in groups.items()]
    return specs


def table12_mixture_specs() -> list[MixtureSpec]:
    """Table 12's mixtures: the local ones (K scaled), then those for `--scale paper`."""
    local = multitask_members()
    paper = paper_multitask_members()
    paper_groups = {task: tuple(m for m in paper if m.startswith(start))
                    for task, start in PAPER_DOWNSTREAM_PREFIXES.items()}
    return (_table12_specs("multitask", local, MULTITASK_BASE,
                           {t: (t,) for t in FINETUNE}, scaled_k, paper=False)
            + _table12_specs("paper_multitask", paper, PAPER_MULTITASK_BASE, paper_groups,
                             lambda log2_k: 2 ** log2_k, paper=True))


# Table 14 (the final T5 models, the paper's Section 3.7): multi-task pretraining on span
# corruption (mean span 3, 15%) plus every supervised task, examples-proportional, with an
# artificial size for the unlabeled set per model size and WMT En-Fr / En-De capped at 1M
# examples (the other supervised sets are all smaller than 1M, so one cap of 1M is that cap).
# The local mixtures (corpus + the local finetuning sets) scale both by K_SCALE, as Table 11's.
T5_FINAL_UNLABELED_SIZES = {"small": 710_000, "base": 2_620_000, "large": 8_660_000,
                            "3b": 33_500_000, "11b": 133_000_000}
T5_FINAL_SUPERVISED_CAP = 1_000_000


def table14_mixture_specs() -> list[MixtureSpec]:
    """multitask_t5_<size> (local) and paper_multitask_t5_<size> (--scale paper)."""
    local = ("corpus_span_corruption",) + tuple(FINETUNE)
    paper = ("c4_span_corruption",) + tuple(m for m in paper_multitask_members()
                                            if m != PAPER_MULTITASK_BASE)
    specs = []
    for size, n in T5_FINAL_UNLABELED_SIZES.items():
        specs += [MixtureSpec(f"multitask_t5_{size}", local,
                              cap=int(T5_FINAL_SUPERVISED_CAP * K_SCALE),
                              fixed=((local[0], int(n * K_SCALE)),)),
                  MixtureSpec(f"paper_multitask_t5_{size}", paper, cap=T5_FINAL_SUPERVISED_CAP,
                              fixed=((paper[0], n),), paper=True)]
    return specs


def mixture_specs() -> list[MixtureSpec]:
    """Every built-in mixture: the local ones, then those for `--scale paper`."""
    local = tuple(FINETUNE)
    specs = [MixtureSpec(name, local, rate) for name, rate in LOCAL_MIXTURES.items()]
    specs.append(MixtureSpec("pretrain_finetune_local", ("corpus_span_corruption",) + local))
    specs += _multitask_specs("multitask", multitask_members(), scaled_k, paper=False)
    specs += [MixtureSpec("paper_glue", tuple(f"paper_glue_{t}" for t in PAPER_GLUE_TRAIN),
                          cap=2 ** 21, paper=True),
              MixtureSpec("paper_super_glue",
                          tuple(f"paper_super_glue_{t}" for t in PAPER_SUPERGLUE_TRAIN),
                          cap=2 ** 21, paper=True)]
    specs += _multitask_specs("paper_multitask", paper_multitask_members(),
                              lambda log2_k: 2 ** log2_k, paper=True)
    specs += table12_mixture_specs()
    specs += table14_mixture_specs()
    members, weights = zip(*WIKIPEDIA_TBC)
    specs += [MixtureSpec("sp8k_wikipedia_tbc_iid_denoising",
                          tuple(f"sp8k_{m}" for m in members), weights=weights),
              MixtureSpec("wikipedia_tbc_iid_denoising", members, weights=weights, paper=True)]
    return specs


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


def _task_row(spec: TaskSpec) -> Row:
    _, column, vocab_dataset = VOCABS[spec.vocabulary]
    local_source = (spec.source,) if spec.source not in UNPREPARED_SOURCES + ("",) else ()
    return Row(spec.name, "task", tuple(sorted(spec.features())), column, spec.metrics,
               needs=local_source + (vocab_dataset,))


def rows() -> list[Row]:
    """Every built-in task (by name), then every mixture (by name)."""
    tasks = {spec.name: _task_row(spec) for spec in task_specs()}
    out = [tasks[n] for n in sorted(tasks)]
    for mixture in sorted(mixture_specs(), key=lambda m: m.name):
        members = sorted(mixture.members)
        needs = tuple(dict.fromkeys(n for m in members for n in tasks[m].needs))
        out.append(Row(mixture.name, "mixture", tasks[members[0]].features, "",
                       members=tuple(members), needs=needs))
    return out
