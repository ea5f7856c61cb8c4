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
(12 + 12 layers), 512 tokens, 2^18 + 2^18 steps (t5lite/ablations.py SCALES).

    t5lite ablate --table table2 --workdir runs/ablate
    t5lite ablate --table table2 --workdir runs/ablate --rows encdec_denoising lm_lm --dry-run
"""

from t5lite.ablations import BASELINE_PRETRAIN, Row, Table

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
    "denoising": ("Denoising", lambda arch: ()),
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
                   pretrain=objective(a))
               for o, (olabel, objective) in OBJECTIVES.items()
               for a, (alabel, params, cost, both) in ARCHITECTURES.items()),
)
