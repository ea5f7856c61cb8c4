"""The T5 paper's setting as data: its published baseline numbers, the downstream tasks a row
is finetuned and tested on (DOWNSTREAM), and the scales a study runs at (SCALES)."""

from __future__ import annotations

import dataclasses

from t5lite import task_catalog

# The paper's benchmarks, in its table order, and its Table 1 baseline (mean and standard
# deviation over 10 runs) and no-pretraining rows (arXiv 1910.10683). These and the tables'
# numbers in configs/ablations/ were checked row by row against the paper's text (ar5iv
# rendering); tests/test_paper_numbers.py pins them.
PAPER_COLUMNS = ("GLUE", "CNNDM", "SQuAD", "SGLUE", "EnDe", "EnFr", "EnRo")
PAPER_BASELINE = (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65)
PAPER_BASELINE_STD = (0.235, 0.065, 0.343, 0.416, 0.112, 0.090, 0.108)
PAPER_NO_PRETRAINING = (66.22, 17.60, 50.31, 53.04, 25.86, 39.77, 24.04)


@dataclasses.dataclass(frozen=True)
class Downstream:
    """How to finetune and evaluate on one task (the paper: GLUE, CNN/DM, WMT, ...)."""

    config: str  # finetuning config file (keeps the best params by `eval.best_metric`)
    overrides: tuple  # task-specific overrides of that config
    metrics: tuple  # metrics shown in the table (the paper: one per benchmark)
    test_examples: int = 0  # held-out examples decoded for the result (0 = the whole split)
    # a benchmark made of several tasks (GLUE, SuperGLUE): finetune on the mixture named by the
    # overrides, evaluate each member and report "<key>/average", the paper's score: the mean
    # over ``score``'s groups ((name, metric keys), ...) of each group's mean metric
    members: tuple = ()
    column: str = ""  # the paper's column this task stands for ("" = none)
    eval_task: str = ""  # the seqio task evaluated ("" = the DOWNSTREAM key)
    score: tuple = ()
    # trained from random params in every row (Narang et al.'s WMT'14 column)
    from_scratch: bool = False
    # overrides after the scale's and the table's: the task's own steps, lengths and batch
    final: tuple = ()


def _paper_task(mixture: str, metric: str, lengths: dict, column: str, score=None,
                max_length: int = 0) -> Downstream:
    """score: a benchmark's score table (task_catalog.PAPER_*_SCORE); its tasks are the
    members evaluated."""
    members = task_catalog.score_tasks(score) if score else ()
    return Downstream("quickstart_finetune", (
        f"data.mixture_or_task={mixture}", f"data.feature_lengths={lengths!r}",
        "train.prepare_data=()", "eval.best_metric=", "data.pack=True",
        f"decode.max_length={max_length or lengths['targets']}"), (metric,), 0, members,
        column, "" if members else mixture, tuple((score or {}).items()))


DOWNSTREAM = {
    "sentiment": Downstream("quickstart_finetune", (), ("sentiment/accuracy",), column="GLUE"),
    "translate_en_de": Downstream("finetune_translate_en_de", (), ("translate_en_de/bleu",),
                                  500, column="EnDe"),
    "summarize_debian": Downstream("quickstart_finetune", (
        "data.mixture_or_task=summarize_debian",
        "data.feature_lengths={'inputs': 128, 'targets': 32}", "data.pack=True",
        "train.prepare_data=('summarize_debian', 'vocab_sp8k')",
        "optim.learning_rate=1e-3", "eval.best_metric=summarize_debian/rouge2",
        "eval.max_examples=200", "decode.max_length=32"), ("summarize_debian/rouge2",), 500,
        column="CNNDM"),
    # 51 Debian sections from package descriptions (47k train, 5,861 test: a binomial standard
    # error of ~0.6 points where sentiment's 351 test sentences give ~2.5); --scale small's task.
    # A linear decay to zero over the run: with a constant rate the runs end mid-climb, where
    # the seeds spread most (bench/RESULTS.md)
    "topic_debian": Downstream("quickstart_finetune", (
        "data.mixture_or_task=topic_debian", "train.prepare_data=('topic_debian', 'vocab_sp8k')",
        "data.feature_lengths.targets=8", "decode.max_length=8", "optim.learning_rate=5e-3",
        "optim.schedule=linear",
        "eval.best_metric=topic_debian/accuracy", "eval.max_examples=1000"),
        ("topic_debian/accuracy",), column="GLUE"),
    # --scale paper: the paper's benchmarks (t5lite/tasks/formats.py, TFDS data dir), the t5
    # vocabulary; finetuning lengths come from SCALES["paper"] (512 / 512, packed). GLUE and
    # SuperGLUE are scored from the task catalog's tables (which need no seqio, so importing
    # this module stays light): MNLI matched + mismatched, no WNLI; T5's simple WSC
    "glue": _paper_task("paper_glue", "glue/average", {"inputs": 512, "targets": 512}, "GLUE",
                        score=task_catalog.PAPER_GLUE_SCORE, max_length=16),
    "cnn_dailymail": _paper_task("paper_cnn_dailymail", "paper_cnn_dailymail/rouge2",
                                 {"inputs": 512, "targets": 512}, "CNNDM", max_length=256),
    # the paper's SQuAD column is exact match (F1 is kept beside it in the results)
    "squad": _paper_task("paper_squad", "paper_squad/em", {"inputs": 512, "targets": 512},
                         "SQuAD", max_length=64),
    "super_glue": _paper_task("paper_super_glue", "super_glue/average",
                              {"inputs": 512, "targets": 512}, "SGLUE",
                              score=task_catalog.PAPER_SUPERGLUE_SCORE, max_length=64),
    # Narang et al. 2021's XSum and closed-book WebQuestions (tasks/narang_tasks.py), with the
    # paper's code's settings: XSum's 2^18 steps (the scale's) of 2,048 input / 178 target
    # tokens, 32 a batch (65,536 tokens, its batch: transformer_modifications'
    # sequence_lengths/xsum_v110.gin), WebQuestions' 30,000 steps; the columns are ROUGE-2 and
    # exact match on the validation split (WebQuestions': the held-out tail of its train split)
    "xsum": dataclasses.replace(
        _paper_task("paper_xsum", "paper_xsum/rouge2", {"inputs": 2048, "targets": 178},
                    "XSum"), final=(
            "data.feature_lengths={'inputs': 2048, 'targets': 178}", "data.batch_size=32")),
    "web_questions": dataclasses.replace(
        _paper_task("paper_web_questions", "paper_web_questions/em",
                    {"inputs": 512, "targets": 512}, "WebQ", max_length=64),
        final=("train.steps=30000", "checkpoint.every_steps=1000")),
    "wmt_ende": _paper_task("paper_wmt_ende", "paper_wmt_ende/bleu",
                            {"inputs": 512, "targets": 512}, "EnDe", max_length=256),
    "wmt_enfr": _paper_task("paper_wmt_enfr", "paper_wmt_enfr/bleu",
                            {"inputs": 512, "targets": 512}, "EnFr", max_length=256),
    # Narang et al. 2021's WMT'14 En-De column: trained from random params in every row, 150,000
    # steps, the learning rate warmed up linearly over the first 20,000 (the paper's text; the
    # published command's linear_warmup keeps Mesh TF's default 10,000: transformer_modifications
    # README.md, learning_rate_schedules.py linear_warmup). The paper's 37k vocabulary is not
    # public (transformer_modifications tasks.py :35, WMT14_CUSTOM_SPM_PATH: "only resides in
    # CNS"): it reads the t5 one (German is in cc_all, not in the table's English cc_en)
    "wmt_ende_scratch": dataclasses.replace(
        _paper_task("paper_wmt_ende", "paper_wmt_ende/bleu", {"inputs": 512, "targets": 512},
                    "WMT EnDe", max_length=256), from_scratch=True,
        final=("train.steps=150000", "optim.warmup_steps=20000", "data.paper_vocabulary=t5")),
    "wmt_enro": _paper_task("paper_wmt_enro", "paper_wmt_enro/bleu",
                            {"inputs": 512, "targets": 512}, "EnRo", max_length=256),
}
PAPER_TASKS = ("glue", "cnn_dailymail", "squad", "super_glue", "wmt_ende", "wmt_enfr",
               "wmt_enro")


@dataclasses.dataclass(frozen=True)
class Scale:
    pretrain: tuple = ()
    finetune: tuple = ()
    tasks: tuple = ()  # default downstream tasks at this scale (() = the table's)
    # renames of the pretraining task / mixture: (prefix, replacement), e.g. the local corpus
    # tasks -> the C4 ones
    renames: tuple = ()
    report_split: str = "test"  # split of the reported numbers (the paper: validation)
    # choose the best checkpoint per task by evaluating every kept checkpoint (the paper);
    # False: the finetuning run's best params by eval.best_metric
    per_task_checkpoints: bool = False
    # finetuning continues the pretraining run: its step count and optimizer state
    # (checkpoint.init_state), for its own train.steps more (T5's finetune)
    continue_pretraining: bool = False


_T5_BASE = ("model.d_model=768", "model.num_heads=12", "model.head_dim=64", "model.d_ff=3072",
            "model.num_encoder_layers=12", "model.num_decoder_layers=12", "model.ffn=relu",
            "model.tie_embeddings=True", "model.scale_tied_logits=True",
            "model.dropout_rate=0.1", "model.dtype=bfloat16", "data.batch_size=128",
            "model.vocab_size=32128",
            # Mesh TF's dropout masks (one per example and feature, shared along the length)
            # and initializers (models/layers.py dropout, kernel_init, attention_init)
            "model.dropout_broadcast=length", "model.initializers=mesh_tf")
PAPER_PRETRAIN_STEPS = 2 ** 19  # 2^35 tokens: 524,288 steps x 128 x 512
PAPER_FINETUNE_STEPS = 2 ** 18
SCALES = {
    # CPU: tiny T5 v1.1 (2+2 layers, d_model 128, 8k vocabulary), 128-token inputs. Sized
    # for minutes per row (sentiment only) on 2 idle cores, from the quickstart's measured step
    # time (bench/RESULTS.md); the finetuning steps are cheaper (64 + 4 tokens).
    # Too few steps to separate the rows (most land near the majority class): a smoke test.
    "tiny": Scale(
        pretrain=("train.steps=150", "checkpoint.every_steps=50", "train.eval_every=0"),
        finetune=("train.steps=150", "eval.every_steps=50", "checkpoint.every_steps=50")),
    # CPU study: the same tiny model on 64-token inputs (half the pretraining cost per step),
    # 1200 pretraining steps (2.5M tokens; fewer did not help the finetuned model), and the
    # quickstart's finetuning length (600 steps), keeping the best of 4 checkpoints on
    # validation; reports the test split. Downstream: topic_debian, whose 5,861 test examples
    # measure to ~0.6 points and which this little pretraining helps (sentiment, which it does
    # not help, stays available: --tasks sentiment). Aimed at Table 2's key rows (pretrained
    # baseline vs no pretraining, denoising vs LM) on 2 idle cores (bench/RESULTS.md has what
    # was measured).
    "small": Scale(
        pretrain=("train.steps=1200", "checkpoint.every_steps=200", "train.eval_every=0",
                  "data.feature_lengths.inputs=64", "optim.warmup_steps=100"),
        finetune=("train.steps=600", "eval.every_steps=150", "checkpoint.every_steps=150"),
        tasks=("topic_debian",)),
    # The paper's setting (Section 3.1): T5 base (v1.0: 12+12 layers, d_model 768, ReLU, tied
    # head), the t5 32k SentencePiece vocabulary, C4 (TFDS c4/en), batch 128, 512 input tokens,
    # 2^19 steps of pretraining (inverse square root LR, 10^4 warmup) and 2^18 of finetuning
    # (constant LR 1e-3) on 128 packed length-512 sequences, checkpoints every 5,000 steps and
    # the best one per task on the validation split, which is what the paper reports.
    # Finetuning continues the pretraining run as T5's did (t5/models/mtf_model.py finetune
    # trains to pretrained step + finetune steps from init_checkpoint, which mesh_tensorflow
    # restores with every variable the graph shares with it: the global step and Adafactor's
    # accumulators; t5x's finetune.gin restores the whole train state likewise): from step 2^19
    # with the pretraining run's optimizer state to 2^19 + 2^18, at a constant 1e-3
    # (T5's constant_0_001.gin). The tiny and small scales start finetuning afresh.
    "paper": Scale(
        pretrain=_T5_BASE + (f"train.steps={PAPER_PRETRAIN_STEPS}", "optim.warmup_steps=10000",
                             "train.prepare_data=()",
                             "data.feature_lengths={'inputs': 512, 'targets': 114}",
                             # Table 11's multi-task mixtures cut the longest CNN/DM summaries
                             # at 114 tokens, as the paper's code did: logged, not refused
                             "data.max_trimmed=1.0",
                             "checkpoint.every_steps=5000", "train.eval_every=5000"),
        finetune=_T5_BASE + (f"train.steps={PAPER_FINETUNE_STEPS}", "optim.learning_rate=1e-3",
                             "optim.schedule=constant", "optim.warmup_steps=0",
                             "data.feature_lengths={'inputs': 512, 'targets': 512}",
                             "data.pack=True", "eval.every_steps=0", "eval.max_examples=0",
                             "checkpoint.every_steps=5000", "checkpoint.keep=1000"),
        # Table 8's data sets keep their names with the t5 vocabulary (sp8k_c4_noclean_* ->
        # c4_noclean_*)
        tasks=PAPER_TASKS, renames=(("corpus_", "c4_"), ("multitask_", "paper_multitask_"),
                                    ("sp8k_", "")),
        report_split="validation", per_task_checkpoints=True, continue_pretraining=True),
}

# A row whose pretraining mixes in the local finetuning sets (Table 11's multi-task rows) has
# them all prepared where the scale prepares local data at all (tiny, small: the config's own
# train.prepare_data is not empty); --scale paper reads C4 and the benchmarks from TFDS and
# prepares nothing.
PREPARE_LOCAL_SETS = ("train.prepare_data:=cfg.train.prepare_data and "
                      + repr(("corpus", "vocab_sp8k") + tuple(task_catalog.FINETUNE)))

# The paper's baseline objective (Section 3.1.4): i.i.d. 15% corruption, each corrupted span
# replaced by one sentinel ("replace corrupted spans"). The tables other than 4 start here.
BASELINE_PRETRAIN = ("data.mixture_or_task=corpus_iid_denoising",
                     "data.feature_lengths.targets:=iid_targets(L, 0.15)")
