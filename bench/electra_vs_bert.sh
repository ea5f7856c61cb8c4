#!/usr/bin/env bash
# ELECTRA tiny vs BERT tiny MLM at equal steps on the local corpus (8k vocabulary, the same
# corpus_mlm rows, optimizer and schedule), then each finetuned on sentiment; test accuracy.
#
#   bash bench/electra_vs_bert.sh [RUNS_DIR] [PRETRAIN_STEPS] [FINETUNE_STEPS]
#
# Every stage resumes from its workdir. Results: RUNS_DIR/*.eval.txt, wall times printed.
# Both pretrainings clip the global gradient norm at 1.0 (the ELECTRA preset's setting).
set -euo pipefail
RUNS="${1:-runs/electra_vs_bert}"
PRE="${2:-400}"
FT="${3:-400}"
mkdir -p "$RUNS"
T5="python -m t5lite.cli"

stage() {  # name, then the command; prints the wall time
    local name="$1"; shift
    local t0=$SECONDS
    echo "=== $name: $*"
    "$@"
    echo "=== $name: $((SECONDS - t0)) s"
}

stage bert_mlm $T5 train --config configs/tiny_bert_mlm.py --workdir "$RUNS/bert_mlm" \
    --set train.steps=$PRE --set optim.clip_grad_norm=1.0
stage electra_rtd $T5 train --config configs/tiny_electra_rtd.py --workdir "$RUNS/electra_rtd" \
    --set train.steps=$PRE
stage bert_sentiment $T5 train --config configs/tiny_bert_sentiment.py \
    --workdir "$RUNS/bert_sentiment" --set "checkpoint.init_from=$RUNS/bert_mlm" \
    --set model.vocab_size=8192 --set data.mixture_or_task=sentiment_cls \
    --set 'train.prepare_data=("sentiment", "vocab_sp8k")' --set train.steps=$FT
stage electra_sentiment $T5 train --config configs/tiny_electra_sentiment.py \
    --workdir "$RUNS/electra_sentiment" --set "checkpoint.init_from=$RUNS/electra_rtd" \
    --set train.steps=$FT
for m in bert electra; do
    stage ${m}_eval $T5 eval --checkpoint "$RUNS/${m}_sentiment" --task sentiment_cls \
        --split test | tee "$RUNS/${m}_sentiment.eval.txt"
done
