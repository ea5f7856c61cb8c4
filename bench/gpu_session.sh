#!/usr/bin/env bash
# One GPU session's measurements, in two parts that fit a short lease (bench/RESULTS.md#gpu):
#   bash bench/gpu_session.sh OUTDIR 1   # T5 base (profiled), GPT-2 small, T5 base at 8k inputs
#   bash bench/gpu_session.sh OUTDIR 2   # T5 with flash_gpu; BERT base, T5 large, T5 base 2k
#   bash bench/gpu_session.sh OUTDIR 3   # unrolled layers (the profile's scan copies),
#                                        # flash_gpu at 2k, T5 large against torch.compile
#   bash bench/gpu_session.sh OUTDIR 4   # next: T5 large unrolled (its compile time first),
#                                        # GPT-2 small unrolled with a profile
# SMOKE=1 runs the same on any CPU with the tiny presets (a check of this script).
# OUTDIR gets at most 8 files: the environment, the JSON lines and tables, failed sides' stderr,
# and (part 1) the profile's summary, its trace and XLA's optimized HLO of the step.
set -u
out=${1:?usage: gpu_session.sh OUTDIR 1|2|3|4}
part=${2:?usage: gpu_session.sh OUTDIR 1|2|3|4}
here=$(cd "$(dirname "$0")" && pwd)
smoke=${SMOKE:+--smoke}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
mkdir -p "$out"
bench() { python3 "$here/gpu_step.py" $smoke --failures "$out/failures.txt" "$@"; }

if [ "$part" = 1 ]; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    python3 -c "import sys, jax, flax, optax, torch, transformers as t; print('python',
sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax',
optax.__version__, 'torch', torch.__version__, 'transformers', t.__version__)"
  } > "$out/env.txt" 2>&1
  trace=$(mktemp -d)
  bench --cases t5_base,gpt2_small,t5_base_8k --budget-s "${BUDGET:-350}" --trace t5_base \
    --trace-dir "$trace" --out "$out/gpu_step.jsonl" > "$out/log.txt" 2>&1
  cp "$trace/profile.json" "$out/" 2>/dev/null
  gzip -c "$trace"/xplane/plugins/profile/*/*.xplane.pb > "$out/xplane.pb.gz" 2>/dev/null
  (cd "$trace/hlo" 2>/dev/null && tar czf "$out/hlo.tgz" \
    $(ls | grep -E 'jit_step_fn\..*(after_optimizations\.txt|memory-usage-report\.txt)$'))
  cat "$out/gpu_step.md" "$out/env.txt"
elif [ "$part" = 3 ]; then
  trace=$(mktemp -d)
  bench --sides t5lite --set model.scan_unroll=0 --cases t5_base,gpt2_small,bert_base \
    --trace t5_base --trace-dir "$trace" --budget-s "${BUDGET_A:-150}" \
    --out "$out/unrolled.jsonl" > "$out/log3.txt" 2>&1
  cp "$trace/profile.json" "$out/" 2>/dev/null
  bench --sides t5lite --attention-kernel flash_gpu --cases t5_base_2k \
    --budget-s "${BUDGET_B:-50}" --out "$out/flash_gpu_2k.jsonl" >> "$out/log3.txt" 2>&1
  bench --cases t5_large --sides t5lite,hf_compile --budget-s "${BUDGET_C:-200}" \
    --out "$out/t5_large.jsonl" >> "$out/log3.txt" 2>&1
  cat "$out/unrolled.md" "$out/flash_gpu_2k.md" "$out/t5_large.md"
elif [ "$part" = 4 ]; then
  bench --sides t5lite --set model.scan_unroll=0 --cases t5_large --budget-s "${BUDGET_A:-300}" \
    --out "$out/t5_large_unrolled.jsonl" > "$out/log4.txt" 2>&1
  trace=$(mktemp -d)
  bench --sides t5lite --set model.scan_unroll=0 --cases gpt2_small --trace gpt2_small \
    --trace-dir "$trace" --budget-s "${BUDGET_B:-150}" --out "$out/gpt2_unrolled.jsonl" \
    >> "$out/log4.txt" 2>&1
  cp "$trace/profile.json" "$out/gpt2_profile.json" 2>/dev/null
  cat "$out/t5_large_unrolled.md" "$out/gpt2_unrolled.md"
else
  bench --sides t5lite --attention-kernel flash_gpu --cases t5_base,t5_base_8k \
    --budget-s "${BUDGET_A:-120}" --out "$out/flash_gpu.jsonl" > "$out/log2.txt" 2>&1
  bench --cases bert_base,t5_large,t5_base_2k --budget-s "${BUDGET_B:-170}" \
    --out "$out/gpu_step2.jsonl" >> "$out/log2.txt" 2>&1
  cat "$out/flash_gpu.md" "$out/gpu_step2.md"
fi
