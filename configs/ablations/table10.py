"""T5 paper (Raffel et al. 2020), Table 10: finetuning only a subset of the parameters. ★ All
parameters; adapter layers (a bottleneck of inner size d after each attention and MLP
sub-layer; only the adapters, the layer norms and any new head train: model.peft.adapter_dim,
model.peft.train_also) with the paper's d = 32, 128, 512, 2048; gradual unfreezing
(model.peft.unfreeze_every: the top layer group first, one more every steps / layers steps).

Pretraining is the same in every row (the baseline objective); only the finetuning stage
changes, so the rows could share one pretrained model; each row still pretrains its own (same
seed, same result) to keep rows independent and resumable.
Differences from the paper: at tiny scale d_model is 128, so d = 512 and 2048 are wider than
the model (the paper: d_model 768). Gradual unfreezing follows the paper: each episode opens
one more encoder and one more decoder layer, from the top (t5lite/models/peft.py); the tiny
model has 2 + 2 layers, so 2 episodes instead of 12. Its untied input embedding (T5 v1.1)
opens with the bottom layers; the paper's tied embedding trains throughout.

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py), 128 input
tokens, 150 + 150 steps, sentiment accuracy only (add `--tasks translate_en_de
summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base, 512 tokens, 2^18 + 2^18
steps (t5lite/ablations.py SCALES).

    t5lite ablate --table table10 --workdir runs/ablate
"""

from t5lite.ablations import BASELINE_PRETRAIN, Row, Table

ADAPTERS_TRAIN = "*_norm/*,class_dense/*,token_dense/*,span_dense/*"  # + the adapters

TABLE = Table(
    name="table10",
    caption="Comparison of different alternative fine-tuning methods that only update a "
            "subset of the model's parameters.",
    label_columns=("Fine-tuning method",),
    baseline="all",
    pretrain=BASELINE_PRETRAIN,
    rows=(Row("all", ("All parameters",)),) + tuple(
        Row(f"adapters{d}", (f"Adapter layers, d = {d}",), finetune=(
            f"model.peft.adapter_dim={d}",
            f"model.peft.train_also={ADAPTERS_TRAIN}"))
        for d in (32, 128, 512, 2048)) + (
        Row("gradual_unfreezing", ("Gradual unfreezing",), finetune=(
            "model.peft.unfreeze_layers=1",
            "model.peft.unfreeze_every:=max(1, cfg.train.steps // num_layers(cfg))")),),
)
