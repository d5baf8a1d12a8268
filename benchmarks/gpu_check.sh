#!/usr/bin/env bash
# The GPU check of the LLM scripts, in two calls of a GPU machine, each within 300 s of limits:
#   call 1: preflight (every package the scripts load imports; else exit 3 in seconds), then
#     step_check: rlhf_iif.py's optimizer step eager against --compile (one CUDA graph): float32 equality of 20
#       steps from one state (2 layers of the GPT-Neo-2.7B width), then bf16 ms a step of both at the whole shape,
#       compile and capture time, Dynamo's compiled graphs before and after the timed steps, no host sync in a
#       replay (torch.cuda.set_sync_debug_mode("error")), TORCH_LOGS=recompiles,cudagraphs
#       (benchmarks/compiled_step_check.py);
#     round_time_rlhf_compile: rounds of rlhf_compile.py (rlhf_iif.py compiled), standard PPO and IIF, at $BATCH episodes, and the
#       256-episode round projected from them (benchmarks/round_time.py);
#     iif_cuda: two rounds of iif.py on Acrobot with --cuda (its first line names the device);
#   call 2: preflight, then round_time_rlhf_eager (the same rounds eagerly) and round_time_grpo (grpo_iif.py at the
#     Qwen2.5-0.5B shape, 128 completions of 128 tokens).
# A GPU machine reaches no registry: on a machine that does,
#     bash benchmarks/gpu_check.sh download       # the wheels a GPU machine lacks, into .gpu_wheels/ (~32 MB)
# then carry .gpu_wheels to the GPU machine and run there
#     bash benchmarks/gpu_check.sh 1 && bash benchmarks/gpu_check.sh 2
# The wheels are installed only when a package fails to import. Each call first prints
# "call N: <part> <limit s>, ... within S s"; each part prints "NAME: exit RC in S s" as it ends, then its printout,
# which it writes to $OUT/NAME.md row by row as it measures (its progress to $OUT/NAME.log), so a part stopped by
# its limit keeps what it measured; the call's own lines go to $OUT/callN.txt. The models (random weights, saved in
# bfloat16 once a call) and the Inductor cache live in a temporary folder deleted when the call ends.
# If call 1's preflight fails, its message names what is missing: carry the wheels and run call 1 again.
# On a CPU, at a tiny shape (how the script itself is tested):
#     DEVICE=cpu SHAPE=32x2 QWEN_SHAPE=32x2 BATCH=4 GRPO_BATCH=16 GRPO_TOKENS=4 bash benchmarks/gpu_check.sh 1
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=.gpu_wheels
CALL=${1:-}
if [ "$CALL" = download ]; then  # Python 3.12 wheels, as the GPU machines have
  pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d $WHEELS \
    trl==1.16.0 transformers==5.23.0 huggingface_hub==2.4.0 tokenizers==0.23.3 datasets==5.2.0 dill==0.4.1 \
    multiprocess==0.70.19 tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 peft==0.21.2 fsspec==2026.9.0 \
    httpx2==2.16.2 httpcore2==2.16.2 hf-xet==1.8.0 click regex truststore \
    tensorboard==2.21.0 protobuf==7.36.2 absl-py==2.5.1 markdown==3.11.3 werkzeug==3.1.9 gymnasium==1.4.0 \
    cloudpickle==3.1.3 farama-notifications==0.0.6
  exit
fi
if [ "$CALL" != 1 ] && [ "$CALL" != 2 ]; then
  echo "usage: bash benchmarks/gpu_check.sh 1|2|download (got '${CALL}')" >&2
  exit 2
fi
PYTHON=${PYTHON:-python}
OUT=${OUT:-results/benchmarks/gpu_check}
DEVICE=${DEVICE:-cuda}; SHAPE=${SHAPE:-gpt-neo-2.7B}; QWEN_SHAPE=${QWEN_SHAPE:-qwen2.5-0.5B}
BATCH=${BATCH:-32}; GRPO_BATCH=${GRPO_BATCH:-128}; GRPO_TOKENS=${GRPO_TOKENS:-128}
mkdir -p "$OUT"
exec > >(tee "$OUT/call$CALL.txt")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# every temporary folder of the parts inside $WORK
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$WORK/inductor}" TMPDIR="$WORK"
if [ "$DEVICE" = cpu ]; then threads=(--threads 1); else threads=(); fi
if [ "$CALL" = 1 ]; then
  LIMITS=(wheels 25 preflight 30 build 30 step_check 115 round_time_rlhf_compile 85 iif_cuda 15)
else
  LIMITS=(wheels 25 preflight 30 build 40 round_time_rlhf_eager 110 round_time_grpo 95)
fi
declare -A LIMIT; line=""; total=0
for ((i = 0; i < ${#LIMITS[@]}; i += 2)); do
  LIMIT[${LIMITS[i]}]=${LIMITS[i+1]}; line+="${line:+, }${LIMITS[i]} ${LIMITS[i+1]}"; total=$((total + LIMITS[i+1]))
done
echo "call $CALL: $line within $total s"
part() {  # part NAME COMMAND...: within its limit, the printout to $OUT/NAME.md, the log to $OUT/NAME.log
  local name=$1; shift
  local t0=$SECONDS
  rm -rf "$OUT/${name}_runs"
  timeout "${LIMIT[$name]}" "$@" > "$OUT/$name.md" 2> "$OUT/$name.log"
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s"
  cat "$OUT/$name.md"
  [ $rc -eq 0 ] || tail -20 "$OUT/$name.log"
  [ $rc -eq 0 ] || FAILED+=" $name"
  return $rc
}
FAILED=""
IMPORTS="import numpy, torch, torch.utils.tensorboard, gymnasium, tyro, transformers, peft, datasets, accelerate, trl
import iif, rlhf_iif, grpo_iif
print('python', __import__('sys').version.split()[0], '| torch', torch.__version__, '(CUDA', torch.version.cuda,
      ') | transformers', transformers.__version__, '| trl', trl.__version__, '| peft', peft.__version__,
      '| datasets', datasets.__version__, '| tyro', tyro.__version__)
if '$DEVICE' == 'cuda':
    assert torch.cuda.is_available(), 'DEVICE=cuda, but torch sees no CUDA device'
    print(torch.cuda.get_device_name(), f'{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
df -h "$WORK" | tail -1
if ! $PYTHON -c "$IMPORTS" > /dev/null 2>&1; then
  if [ -d $WHEELS ]; then
    part wheels $PYTHON -m pip install -q --no-deps --no-index $WHEELS/*.whl
  else
    echo "wheels: none carried ($WHEELS/ is absent)"
  fi
fi
if ! part preflight $PYTHON -c "$IMPORTS"; then
  echo "preflight failed: a package the scripts load does not import (above). Carry the wheels of"
  echo "'bash benchmarks/gpu_check.sh download' as $WHEELS/ and run call $CALL again."
  exit 3
fi
if [ "$CALL" = 1 ]; then
  part build $PYTHON benchmarks/round_time.py --shape "$SHAPE" --device "$DEVICE" --task "$WORK/neo" --build-only \
    --save-dtype bfloat16
  TORCH_LOGS=recompiles,cudagraphs part step_check $PYTHON benchmarks/compiled_step_check.py --shape "$SHAPE" \
    --device "$DEVICE" --task "$WORK/neo" --episodes "$BATCH" "${threads[@]}"
  grep -iE "recompil|skipping cudagraphs" "$OUT/step_check.log" | head -5
  part round_time_rlhf_compile $PYTHON benchmarks/round_time.py --shape "$SHAPE" --device "$DEVICE" --compile \
    --task "$WORK/neo" --runs-dir "$OUT/round_time_rlhf_compile_runs" --batch-size "$BATCH" --rounds 2 --reps 1 \
    "${threads[@]}"
  cuda=(--cuda); [ "$DEVICE" = cuda ] || cuda=(--no-cuda)  # iif.py: two rounds of Acrobot on the device
  part iif_cuda $PYTHON iif.py --env-id Acrobot-v1 --env-backend gymnasium --num-steps 1024 --total-timesteps 2048 \
    --eval-episodes 8 \
    --runs-dir "$OUT/iif_cuda_runs" --run-name acrobot "${cuda[@]}"
else
  part build bash -c "$PYTHON benchmarks/round_time.py --shape '$SHAPE' --device '$DEVICE' --task '$WORK/neo' \
    --build-only --save-dtype bfloat16 && $PYTHON benchmarks/round_time.py --shape '$QWEN_SHAPE' --device '$DEVICE' \
    --task '$WORK/qwen' --build-only --save-dtype bfloat16"
  part round_time_rlhf_eager $PYTHON benchmarks/round_time.py --shape "$SHAPE" --device "$DEVICE" \
    --task "$WORK/neo" --runs-dir "$OUT/round_time_rlhf_eager_runs" --batch-size "$BATCH" --rounds 2 --reps 1 \
    "${threads[@]}"
  part round_time_grpo $PYTHON benchmarks/round_time.py --script grpo --shape "$QWEN_SHAPE" --device "$DEVICE" \
    --task "$WORK/qwen" --runs-dir "$OUT/round_time_grpo_runs" --batch-size "$GRPO_BATCH" \
    --gen-tokens "$GRPO_TOKENS" --mini-batch-size 16 --num-generations 8 --rounds 2 --reps 1 "${threads[@]}"
fi
echo "call $CALL: done in $SECONDS s${FAILED:+; failed:$FAILED}"
[ -z "$FAILED" ]
