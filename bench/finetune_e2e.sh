#!/usr/bin/env bash
# End-to-end quality runs on the local data: pretrain -> finetune -> held-out test metrics, for
# the tiny GPT, the tiny BERT and T5 translation (the quickstart covers tiny T5 sentiment).
#
#   bash bench/finetune_e2e.sh [RUNS_DIR] [QUICKSTART_PRETRAIN_DIR]
#
# RUNS_DIR defaults to runs/e2e; the translation finetune starts from the quickstart's pretrained
# T5 (default runs/quickstart/pretrain: run `t5lite quickstart` first, or it is trained here).
# Every stage resumes from its workdir, so a rerun only does what is missing. The results are
# the `t5lite eval` tables printed at the end of each pipeline (also in RUNS_DIR/*.eval.txt).
set -euo pipefail
RUNS="${1:-runs/e2e}"
QS_PRETRAIN="${2:-runs/quickstart/pretrain}"
mkdir -p "$RUNS"

stage() {  # name, then the command; prints the wall time
    local name="$1"; shift
    local t0=$SECONDS
    echo "=== $name: $*"
    "$@"
    echo "=== $name: $((SECONDS - t0)) s"
}

# GPT: causal LM on the corpus, then generative sentiment ("... <eos>" -> label word).
stage gpt_lm t5lite train --config configs/tiny_gpt_lm.py --workdir "$RUNS/gpt_lm"
stage gpt_sentiment t5lite train --config configs/tiny_gpt_sentiment.py \
    --workdir "$RUNS/gpt_sentiment" --set "checkpoint.init_from=$RUNS/gpt_lm"
stage gpt_eval t5lite eval --checkpoint "$RUNS/gpt_sentiment/best" --task sentiment \
    --split test | tee "$RUNS/gpt_sentiment.eval.txt"

# BERT: MLM + NSP on the corpus (8k vocabulary), then a [CLS] classifier on sentiment.
stage bert_mlm t5lite train --config configs/tiny_bert_mlm.py --workdir "$RUNS/bert_mlm" \
    --set model.nsp_head=True
stage bert_sentiment t5lite train --config configs/tiny_bert_sentiment.py \
    --workdir "$RUNS/bert_sentiment" --set "checkpoint.init_from=$RUNS/bert_mlm" \
    --set model.vocab_size=8192 --set data.mixture_or_task=sentiment_cls \
    --set 'train.prepare_data=("sentiment", "vocab_sp8k")'
stage bert_eval t5lite eval --checkpoint "$RUNS/bert_sentiment" --task sentiment_cls \
    --split test | tee "$RUNS/bert_sentiment.eval.txt"

# T5: English -> German translation from the quickstart's pretrained tiny T5, BLEU on test.
if [ ! -d "$QS_PRETRAIN/checkpoints" ]; then
    stage t5_pretrain t5lite train --config configs/quickstart.py --workdir "$QS_PRETRAIN"
fi
stage en_de t5lite train --config configs/finetune_translate_en_de.py \
    --workdir "$RUNS/en_de" --set "checkpoint.init_from=$QS_PRETRAIN"
stage en_de_eval t5lite eval --checkpoint "$RUNS/en_de/best" --task translate_en_de \
    --split test | tee "$RUNS/en_de.eval.txt"

python - "$RUNS" <<'EOF'
import collections, os, sys
root = os.path.expanduser(os.environ.get("T5LITE_DATA_DIR", "~/.cache/t5lite"))
labels = [l.rstrip("\n").split("\t")[-1]
          for l in open(os.path.join(root, "finetune/sentiment/test.tsv"), encoding="utf-8")
          if l.strip()]
label, n = collections.Counter(labels).most_common(1)[0]
print(f"sentiment test: {len(labels)} examples, majority class {label!r} "
      f"{100 * n / len(labels):.1f}%")
EOF
