"""T5 paper (Raffel et al. 2020), Table 2: architectures x pretraining objective.

Architectures (t5lite/config.py ModelConfig, set for both stages): ★ encoder-decoder (L + L
layers, 2P params, cost M), encoder-decoder with shared parameters (model.
shared_encoder_decoder: P, M), encoder-decoder with half the layers each (P, M/2),
decoder-only language model (L layers: P, M) and prefix LM (decoder-only, bidirectional over
the inputs). Objectives: denoising (the baseline i.i.d. 15% span replacement; a decoder-only
model reads inputs and targets as one sequence, loss on the targets) and LM (a text chunk split
at a random point: prefix -> continuation, corpus_prefix_lm; the plain language model predicts
the whole chunk, corpus_lm). LM examples are L - 1 tokens of text, as the denoising ones.

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py, 2 + 2
layers, 8k vocabulary), 128 input tokens, 150 + 150 steps, sentiment accuracy only (add
`--tasks translate_en_de summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base
(12 + 12 layers), 512 tokens, 2^19 + 2^18 steps (t5lite/ablations/paper.py SCALES).

    t5lite ablate --table table2 --workdir runs/ablate
    t5lite ablate --table table2 --workdir runs/ablate --rows encdec_denoising lm_lm --dry-run
"""

from t5lite.ablations import BASELINE_PRETRAIN, PAPER_NO_PRETRAINING, Row, Table

# The paper's Table 2 (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo) by row name, checked row by row
# against the paper's text (arXiv 1910.10683, ar5iv rendering), pinned by
# tests/test_paper_numbers.py; the no-pretraining row is its Table 1's
# (ablations.PAPER_NO_PRETRAINING, checked likewise)
PAPER = {
    "encdec_denoising": (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65),
    "shared_denoising": (82.81, 18.78, 80.63, 70.73, 26.72, 39.03, 27.46),
    "half_denoising": (80.88, 18.97, 77.59, 68.42, 26.38, 38.40, 26.95),
    "lm_denoising": (74.70, 17.93, 61.14, 55.02, 25.09, 35.28, 25.86),
    "prefixlm_denoising": (81.82, 18.61, 78.94, 68.11, 26.43, 37.98, 27.39),
    "encdec_lm": (79.56, 18.59, 76.02, 64.29, 26.27, 39.17, 26.86),
    "shared_lm": (79.60, 18.13, 76.35, 63.50, 26.62, 39.17, 27.05),
    "half_lm": (78.67, 18.26, 75.32, 64.06, 26.13, 38.42, 26.89),
    "lm_lm": (73.78, 17.54, 53.81, 56.51, 25.23, 34.31, 25.38),
    "prefixlm_lm": (79.68, 17.84, 76.87, 64.86, 26.28, 37.51, 26.76),
}

ARCHITECTURES = {  # name: (paper label, params, cost, overrides of both stages)
    "encdec": ("Encoder-decoder", "2P", "M", ()),
    "shared": ("Enc-dec, shared", "P", "M", ("model.shared_encoder_decoder=True",)),
    "half": ("Enc-dec, 6 layers", "P", "M/2", (
        "model.num_encoder_layers:=max(1, cfg.model.num_encoder_layers // 2)",
        "model.num_decoder_layers:=max(1, cfg.model.num_decoder_layers // 2)")),
    # decoder-only: as many layers as the encoder-decoder's encoder (P params)
    "lm": ("Language model", "P", "M", (
        "model.architecture=decoder_only",
        "model.num_decoder_layers:=cfg.model.num_encoder_layers")),
    "prefixlm": ("Prefix LM", "P", "M", (
        "model.architecture=prefix_lm",
        "model.num_decoder_layers:=cfg.model.num_encoder_layers")),
}
OBJECTIVES = {  # name: (paper label, pretraining overrides per architecture kind)
    # a decoder-only LM reads the denoising example as one sequence, inputs EOS targets, with
    # the loss on all of it (the reference's delimited LM); a prefix LM keeps the inputs as
    # its bidirectional prefix, loss on the targets
    "denoising": ("Denoising", lambda arch: (
        "data.mixture_or_task=corpus_iid_denoising_lm",
        "data.feature_lengths:={'targets': L + iid_targets(L, 0.15)}") if arch == "lm" else ()),
    "lm": ("LM", lambda arch: (
        f"data.mixture_or_task={'corpus_lm' if arch == 'lm' else 'corpus_prefix_lm'}",
        "data.feature_lengths.targets:=L")),
}

TABLE = Table(
    name="table2",
    caption="Performance of the different architectural variants (Section 3.2.2); "
            "P = parameters of a 12-layer stack, M = FLOPs of an L + L encoder-decoder.",
    label_columns=("Architecture", "Objective", "Params", "Cost"),
    baseline="encdec_denoising",
    pretrain=BASELINE_PRETRAIN,
    rows=tuple(Row(f"{a}_{o}", (alabel, olabel, params, cost), both=both,
                   pretrain=objective(a), paper=PAPER[f"{a}_{o}"])
               for o, (olabel, objective) in OBJECTIVES.items()
               for a, (alabel, params, cost, both) in ARCHITECTURES.items())
    # the paper's Table 1 control: the baseline model finetuned from random parameters
    + (Row("no_pretraining", ("Encoder-decoder", "No pre-training (Table 1)", "2P", "M"),
           pretrained=False, paper=PAPER_NO_PRETRAINING),),
)
