#!/usr/bin/env bash
# SpanBERT-tiny vs BERT-tiny (MLM only, no NSP) at equal steps on the local corpus (8k
# vocabulary, packed 128-token rows, batch 32), then each finetuned as a [CLS] classifier on
# sentiment; test accuracy from `t5lite eval`. Numbers: bench/RESULTS.md ("SpanBERT").
#
#   bash bench/spanbert_vs_bert.sh [RUNS_DIR] [PRETRAIN_STEPS] [FINETUNE_STEPS] [FINETUNE_SEED]
#
# FINETUNE_SEED > 0 finetunes the same pretrained models again with train.seed / data.seed set
# (workdirs *_sentiment_s<SEED>).
# Every stage resumes from its workdir, so a rerun only does what is missing.
set -euo pipefail
RUNS="${1:-runs/spanbert_vs_bert}"
PRE="${2:-300}"
FT="${3:-300}"
SEED="${4:-0}"
SUFFIX=""
ft_seed=()
if [ "$SEED" != 0 ]; then
    SUFFIX="_s$SEED"
    ft_seed=(--set "train.seed=$SEED" --set "data.seed=$SEED")
fi
mkdir -p "$RUNS"

stage() {  # name, then the command; prints the wall time
    local name="$1"; shift
    local t0=$SECONDS
    echo "=== $name: $*"
    "$@"
    echo "=== $name: $((SECONDS - t0)) s"
}

common=(--set "train.steps=$PRE" --set train.eval_every=100 --set train.eval_steps=4
        --set checkpoint.every_steps=100)
stage spanbert t5lite train --config configs/tiny_spanbert.py --workdir "$RUNS/spanbert" \
    "${common[@]}"
stage bert_mlm t5lite train --config configs/tiny_bert_mlm.py --workdir "$RUNS/bert_mlm" \
    --set data.mixture_or_task=corpus_mlm_only --set data.pack=True "${common[@]}"
for pre in spanbert bert_mlm; do
    stage "${pre}_sentiment$SUFFIX" t5lite train --config configs/tiny_bert_sentiment.py \
        --workdir "$RUNS/${pre}_sentiment$SUFFIX" --set "checkpoint.init_from=$RUNS/$pre" \
        --set model.vocab_size=8192 --set data.mixture_or_task=sentiment_cls \
        --set 'train.prepare_data=("sentiment", "vocab_sp8k")' --set "train.steps=$FT" \
        --set train.eval_every=100 --set checkpoint.every_steps=100 "${ft_seed[@]}"
    stage "${pre}_eval$SUFFIX" t5lite eval --checkpoint "$RUNS/${pre}_sentiment$SUFFIX" \
        --task sentiment_cls --split test | tee "$RUNS/${pre}_sentiment$SUFFIX.eval.txt"
done
