#!/usr/bin/env bash
# The GPU check of the LLM scripts, in one call of a GPU machine (about 9 minutes on one H100 or H200):
#   1. rlhf_iif.py's optimizer step, eager against --compile (CUDA graph), at the GPT-Neo-2.7B shape: losses and
#      weights after 20 steps from one state, recompiles, host syncs, ms a step (benchmarks/compiled_step_check.py);
#   2. a round of rlhf_iif.py --compile, standard PPO and IIF, 256 episodes (benchmarks/round_time.py);
#   3. rlhf_iif.py eagerly, at 32 episodes a round (the step does not depend on the batch; a full eager round is
#      the committed H200 printout's 110 s);
#   4. grpo_iif.py at the Qwen2.5-0.5B shape, 128 completions of 128 tokens.
# Every part has its own time limit and writes its printout to $OUT (default results/benchmarks/gpu_check), the
# GPU's first. A GPU machine reaches no registry: first, on a machine that does,
#     bash benchmarks/gpu_check.sh download       # the wheels a GPU machine lacks, into .gpu_wheels/ (~25 MB)
# then carry .gpu_wheels to the GPU machine and run there
#     bash benchmarks/gpu_check.sh
# On a CPU, at a tiny shape, in about 2 minutes (how the script itself is tested):
#     DEVICE=cpu SHAPE=64x2 QWEN_SHAPE=64x2 BATCH=8 EAGER_BATCH=8 GRPO_BATCH=16 GRPO_TOKENS=8 bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=.gpu_wheels
if [ "${1:-}" = download ]; then  # Python 3.12 wheels, as the GPU machines have
  pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d $WHEELS \
    trl==1.16.0 transformers==5.23.0 huggingface_hub==2.4.0 tokenizers==0.23.3 datasets==5.2.0 dill==0.4.1 \
    multiprocess==0.70.19 tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 peft==0.21.2 fsspec==2026.9.0 \
    httpx2==2.16.2 httpcore2==2.16.2 hf-xet==1.8.0 click regex truststore
  exit
fi
OUT=${OUT:-results/benchmarks/gpu_check}
DEVICE=${DEVICE:-cuda}; SHAPE=${SHAPE:-gpt-neo-2.7B}; QWEN_SHAPE=${QWEN_SHAPE:-qwen2.5-0.5B}
BATCH=${BATCH:-256}; EAGER_BATCH=${EAGER_BATCH:-32}; GRPO_BATCH=${GRPO_BATCH:-128}; GRPO_TOKENS=${GRPO_TOKENS:-128}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -d $WHEELS ] && ! python -c "import trl" 2>/dev/null; then
  pip install -q --no-deps --no-index $WHEELS/*.whl 2>&1 | tail -3
fi
if [ "$DEVICE" = cpu ]; then threads=(--threads 1); else threads=(); fi
part() {  # part NAME SECONDS COMMAND...: the command's printout to $OUT/NAME.md, its log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.md" 2> "$OUT/$name.log"
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] && cat "$OUT/$name.md" || tail -20 "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
TORCH_LOGS=recompiles,cudagraphs part step_check 230 python benchmarks/compiled_step_check.py --shape "$SHAPE" \
  --device "$DEVICE" "${threads[@]}"
grep -iE "recompil|skipping cudagraphs" "$OUT/step_check.log" | head -5
part round_time_rlhf_compile 160 python benchmarks/round_time.py --shape "$SHAPE" --device "$DEVICE" --compile \
  --batch-size "$BATCH" --rounds 2 --reps 1 "${threads[@]}"
part round_time_rlhf_eager 100 python benchmarks/round_time.py --shape "$SHAPE" --device "$DEVICE" \
  --batch-size "$EAGER_BATCH" --rounds 2 --reps 1 "${threads[@]}"
part round_time_grpo 60 python benchmarks/round_time.py --script grpo --shape "$QWEN_SHAPE" --device "$DEVICE" \
  --batch-size "$GRPO_BATCH" --gen-tokens "$GRPO_TOKENS" --mini-batch-size 16 --num-generations 8 --rounds 2 \
  --reps 1 "${threads[@]}"
