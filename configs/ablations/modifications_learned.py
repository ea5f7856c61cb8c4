"""Narang et al. 2021, Appendix A ("Experiments with positional embeddings"), its Table 2:
the modifications of Table 1 (configs/ablations/modifications.py) on a vanilla Transformer
with learned absolute position embeddings instead of relative attention, "Besides this
change, the experimental setup remains the same"; the Weighted Transformer is left out, as
the paper (it "doesn't reliably converge using positional embeddings").

Each row is its Table 1 row with `model.position=learned` before its own overrides, and with
the Synthesizers' length bound (a learned table has model.max_length = 512 rows: XSum's 2,048
input tokens become 512 with the batch's tokens kept, as the paper's code's
xsum_v110_512.gin). Two of the appendix's position rows are here, keeping XSum's 2,048:
relative attention with a shared bias (T5's, Table 1's vanilla) and sinusoidal encodings;
relative attention with a bias per layer and Shaw et al.'s relative position
representations are not implemented in t5lite/models/ and are left out (their paper numbers
are in APPENDIX_NOT_RUN). The appendix has no WMT column (the from-scratch translation does
not depend on pretraining's positions).

The numbers: arXiv 2102.11972v2, Appendix A, Table 2, read from a PDF-to-text copy (the only
copy on this machine). Its rows for Synthesizer (random), (random plus), (random plus alpha),
Universal Transformer, Mixture of experts and Switch Transformer are run together in that copy
(two rows' cells in one line) and are left blank here rather than guessed.

    t5lite ablate --table modifications_learned --workdir runs/ablate --rows vanilla swiglu
"""

import dataclasses

from t5lite.ablations import Row
from t5lite.ablations.modifications import COLUMNS, LENGTH_BOUND
from t5lite.ablations.modifications import TABLE as TABLE1

# Params (M), Ops (T), Step/s, Early loss, Final loss, SGLUE, XSum, WebQ
APPENDIX = {
    "vanilla": (223, 11.1, 3.90, 2.245, 1.865, 69.72, 16.94, 24.60),
    "gelu": (223, 11.1, 3.88, 2.220, 1.863, 70.36, 17.10, 23.28),
    "swish": (223, 11.1, 3.93, 2.234, 1.865, 69.60, 17.07, 24.34),
    "elu": (223, 11.1, 3.86, 2.333, 1.942, 64.30, 16.21, 24.07),
    "glu": (223, 11.1, 3.88, 2.212, 1.834, 70.43, 17.42, 24.34),
    "geglu": (223, 11.1, 3.85, 2.172, 1.807, 72.36, 17.69, 24.87),
    "reglu": (223, 11.1, 3.87, 2.190, 1.832, 70.63, 17.38, 21.96),
    "selu": (223, 11.1, 3.84, 2.372, 1.967, 64.68, 16.00, 23.28),
    "swiglu": (223, 11.1, 3.82, 2.168, 1.806, 70.90, 17.51, 25.13),
    "liglu": (223, 11.1, 3.88, 2.180, 1.816, 71.23, 17.55, 24.60),
    "sigmoid": (223, 11.1, 3.94, 2.947, 1.908, 69.36, 16.64, 23.02),
    "softplus": (223, 11.1, 3.77, 2.324, 1.885, 68.99, 16.92, 21.96),
    "rms_norm": (223, 11.1, 3.99, 2.209, 1.856, 69.11, 16.90, 23.55),
    "rezero": (223, 11.1, 4.14, 3.180, 2.506, 54.01, 6.44, 20.90),
    "rezero_layer_norm": (223, 11.1, 3.78, 2.229, 1.902, 64.75, 16.40, 23.02),
    "rezero_rms_norm": (223, 11.1, 3.90, 2.306, 1.948, 59.86, 15.66, 23.02),
    "fixup": (223, 11.1, 3.32, 2.473, 2.236, 57.98, 12.51, 23.28),
    "depth24": (224, 11.1, 3.12, 2.260, 1.874, 70.59, 17.11, 23.02),
    "depth18": (223, 11.1, 3.27, 2.268, 1.878, 70.40, 16.87, 23.02),
    "depth8": (223, 11.1, 3.61, 2.243, 1.871, 68.67, 17.03, 23.55),
    "depth6": (223, 11.1, 3.59, 2.250, 1.882, 68.08, 16.93, 23.81),
    "block_sharing": (65, 11.1, 4.03, 2.777, 2.237, 63.06, 13.89, 21.96),
    "block_sharing_factorized": (45, 9.4, 4.35, 2.670, 2.205, 57.17, 12.13, 20.11),
    "block_sharing_factorized_shared": (20, 9.1, 4.49, 2.874, 2.362, 57.46, 11.78, 19.58),
    "encoder_block_sharing": (170, 11.1, 3.80, 2.399, 2.016, 64.08, 14.74, 21.69),
    "decoder_block_sharing": (144, 11.1, 3.92, 2.542, 2.048, 69.95, 16.01, 21.96),
    "factorized_embed": (227, 9.4, 3.97, 2.273, 1.886, 68.91, 16.41, 21.43),
    "factorized_shared_embed": (202, 9.1, 4.08, 2.387, 2.018, 69.93, 16.07, 21.96),
    "tied_encoder_decoder_input": (248, 11.1, 3.86, 2.254, 1.872, 68.34, 16.60, 22.75),
    "tied_decoder_input_output": (248, 11.1, 3.86, 2.262, 1.871, 69.48, 16.85, 23.28),
    "untied_embeddings": (273, 11.1, 3.83, 2.265, 1.872, 67.99, 16.66, 23.02),
    "adaptive_input": (204, 9.2, 4.15, 2.321, 1.934, 69.20, 16.69, 21.96),
    "adaptive_softmax": (204, 9.2, 4.21, 2.425, 2.009, 67.71, 15.74, 20.11),
    "adaptive_softmax_no_projection": (223, 10.8, 3.97, 2.357, 1.937, 68.68, 16.45, 22.75),
    "mixture_of_softmaxes": (232, 16.3, 2.50, 3.112, 1.843, 70.70, 16.78, 22.75),
    "relative_shared_bias": (223, 11.3, 3.57, 2.194, 1.840, 74.14, 17.62, 24.34),
    "sinusoidal": (223, 11.1, 3.91, 2.278, 1.906, 69.76, 16.25, 22.75),
    "transparent_attention": (223, 11.1, 3.61, 2.244, 1.949, 53.77, 6.39, 15.08),
    "dynamic_conv": (257, 11.8, 2.65, 2.405, 2.038, 55.16, 10.25, 4.50),
    "lightweight_conv": (224, 10.4, 4.05, 2.356, 1.990, 61.32, 14.08, 24.08),
    "evolved_transformer": (217, 9.7, 3.11, 2.233, 1.890, 67.88, 16.40, 24.08),
    "synthesizer_dense": (224, 11.4, 3.61, 2.339, 1.965, 61.02, 14.48, 18.25),
    "synthesizer_dense_plus": (243, 12.6, 3.34, 2.200, 1.832, 74.16, 16.96, 24.87),
    "synthesizer_dense_plus_alpha": (243, 12.6, 3.11, 2.204, 1.846, 75.18, 16.94, 24.60),
    "synthesizer_factorized": (207, 10.1, 4.10, 2.629, 1.964, 61.76, 15.44, 22.49),
    "synthesizer_random": None, "synthesizer_random_plus": None,
    "synthesizer_random_plus_alpha": None, "universal_transformer": None,
    "mixture_of_experts": None, "switch_transformer": None,
    "funnel_transformer": (223, 1.9, 4.83, 2.291, 1.925, 67.11, 16.33, 21.64),
    "product_key_memory": (421, 386.6, 0.25, 2.212, 1.821, 69.62, 16.58, 24.08),
}
# the appendix's position rows whose attention t5lite does not implement
APPENDIX_NOT_RUN = {
    "Relative attention with bias": (223, 11.3, 3.49, 2.197, 1.832, 74.06, 17.63, 24.87),
    "Relative position representation": (223, 11.1, 3.10, 2.189, 1.838, 74.26, 17.67, 24.07),
}
LEARNED = ("model.position=learned",)
POSITION_ROWS = {"relative_shared_bias": ("Relative attention with shared bias",
                                          ("model.position=relative",)),
                 "sinusoidal": ("Sinusoidal positional encoding", ("model.position=sinusoidal",))}


def _rows() -> tuple:
    rows = []
    for r in TABLE1.rows:
        if r.name not in APPENDIX:
            continue
        rows.append(dataclasses.replace(r, both=LEARNED + r.both,
                                        finetune=r.finetune + LENGTH_BOUND,
                                        paper=APPENDIX[r.name]))
        if r.name == "mixture_of_softmaxes":  # the appendix lists its position rows here
            # (no table of positions to bound: XSum keeps its 2,048 input tokens)
            rows += [Row(name, (label,), both=LEARNED + own, paper=APPENDIX[name])
                     for name, (label, own) in POSITION_ROWS.items()]
    return tuple(rows)


TABLE = dataclasses.replace(
    TABLE1, name="modifications_learned",
    caption="Narang et al. 2021, Appendix A: the modifications on a vanilla Transformer with "
            "learned position embeddings.",
    rows=_rows(), paper_columns=COLUMNS[:-1], paper_std=(0.0,) * (len(COLUMNS) - 1),
    paper_source="Paper: Narang et al. 2021 (arXiv 2102.11972v2) Appendix A, Table 2: as "
                 "Table 1 with learned position embeddings (no WMT column); bold = better "
                 "than its vanilla Transformer (the paper's rule). Blank: rows run together "
                 "in the only copy on this machine.",
    scale_tasks=(("paper", ("super_glue", "xsum", "web_questions")),),
)
