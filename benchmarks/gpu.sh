#!/usr/bin/env bash
# The GPU acceptance run: the CUDA tests, smoke on the GPU in float32 / bfloat16 / float16, a 4-bit QLoRA run on the
# Gemma 3 270M architecture, step throughput against a bare PEFT loop with peak memory against
# benchmarks/memory_estimate.py, and engine.workers 1 vs 2 on one GPU. Nothing is downloaded.
#
#   bash benchmarks/gpu.sh OUT [ASSETS]
#
# SKIP="NAME ..." leaves out the steps of those names (as steps.jsonl names them).
# OUT receives gpu.log (everything printed), steps.jsonl (one line per step: name, exit code, seconds),
# step_overhead.jsonl, memory.json, parallel.json, batch_clients.jsonl and smoke.log (the smoke runs' output). ASSETS (default .gpu) may hold whl/
# (wheels of what the machine's Python lacks, installed into /tmp/site) and models/ (the packaged models' configs
# and tokenizers from `python benchmarks/gpu_models.py export ASSETS/models`); without models/ the packaged models
# themselves are used. A step that fails is recorded and the next one runs. Takes about 8 minutes on one H200 (about 7 with SKIP="qlora-gemma").
set -u
OUT=${1:?usage: bash benchmarks/gpu.sh OUT [ASSETS]}
ASSETS=${2:-.gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/gpu.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/fedpeft-gpu-XXXX)

DEVICE=${DEVICE:-cuda}  # DEVICE=cpu QUICK=1 checks this script's plumbing on a machine without a GPU
if [ "${QUICK:-0}" = 1 ]; then SIZES=(4 16 2 16); else SIZES=(32 128 8 256); fi

step() {  # step NAME COMMAND...: run it, time it, record it (unless SKIP names it)
  local name=$1 started code
  shift
  case " ${SKIP:-} " in *" $name "*) echo "=== $name: skipped (SKIP)"; return 0 ;; esac
  echo "=== $name: $*"
  started=$(date +%s%N)
  "$@"
  code=$?
  printf '{"step": "%s", "exit": %d, "seconds": %.1f}\n' "$name" "$code" \
    "$(( ($(date +%s%N) - started) / 1000000 ))e-3" | tee -a "$OUT/steps.jsonl"
}

if [ -d "$ASSETS/whl" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$ASSETS"/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  if ! $PY -c "import transformers, peft, fedpeft.runner" 2>/dev/null; then  # the machine's own versions, then
    echo "the carried transformers/peft do not import here; using the machine's"
    rm -rf /tmp/site/transformers /tmp/site/peft
  fi
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch, transformers, peft, bitsandbytes; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, 'peft', peft.__version__, 'bitsandbytes', bitsandbytes.__version__)"
$PY -c "import os; print('cpu cores', len(os.sched_getaffinity(0)))"

if [ -d "$ASSETS/models" ]; then
  step models $PY benchmarks/gpu_models.py build "$ASSETS/models" "$WORK/models"
  MINILM=$WORK/models/minilm GEMMA=$WORK/models/gemma3-270m
else
  MINILM=minilm GEMMA=gemma3-270m
fi
FEDPEFT="$PY -m fedpeft.cli"

# 1. The CUDA tests (tests/test_cuda.py; deselected on machines without a GPU).
step cuda-tests $PY -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py

# 2. Smoke on the GPU in each dtype (side by side: their timings are not reported), then the peak memory of each.
# A float16 base trains adapters only: its smoke starts from the tiny model's initial weights, without fedavg_full.
FLOAT16=(--set base.kind=pretrained --set "methods=[{name: lora, lr: 0.005, epochs: 2}, \
{name: fedit, rounds: 2, fraction: 0.5, local_steps: 3, lr: 0.005}, {name: local, rounds: 2, local_steps: 3, lr: 0.005}, \
{name: fedp2eft, rounds: 2, fraction: 0.5, r_max: 4, r_init: 8, stage1_steps: 3, psg_steps: 2, lr: 0.005, \
psg_lr: 0.01, finetune_epochs: 1}]")
for dtype in float32 bfloat16 float16; do
  extra=()
  [ "$dtype" = float16 ] && extra=("${FLOAT16[@]}")
  $FEDPEFT run smoke -v --out "$WORK/smoke-$dtype" --set device=$DEVICE --set model.dtype=$dtype "${extra[@]}" \
    > "$WORK/smoke-$dtype.log" 2>&1 &
done
started=$(date +%s)
for dtype in float32 bfloat16 float16; do
  wait -n
done
for dtype in float32 bfloat16 float16; do
  code=0
  [ -f "$WORK/smoke-$dtype/results.jsonl" ] || code=1
  tail -n 3 "$WORK/smoke-$dtype.log"
  { echo "=== smoke-$dtype"; cat "$WORK/smoke-$dtype.log"; } >> "$OUT/smoke.log"
  printf '{"step": "smoke-%s", "exit": %d, "seconds": %d, "records": %s, "peak_cuda_mb": %s}\n' "$dtype" "$code" \
    "$(( $(date +%s) - started ))" "$(cat "$WORK/smoke-$dtype/results.jsonl" 2>/dev/null | wc -l)" \
    "$($PY -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; \
print(max([x['value'] for x in r if x['metric']=='peak_cuda_mb'], default='null'))" \
      "$WORK/smoke-$dtype/costs.jsonl" 2>/dev/null || echo null)" | tee -a "$OUT/steps.jsonl"
done

# 3. QLoRA: the Gemma 3 270M architecture in 4-bit NF4 (bfloat16 compute), LoRA and FedIT on generation data.
step qlora-gemma $FEDPEFT run smoke --out "$WORK/qlora" --set device=$DEVICE --set "model.name=$GEMMA" \
  --set model.quantization=4bit --set model.dtype=bfloat16 --set model.max_length=64 \
  --set data.name=synthetic-fedaya --set "data.groups=[lat1, lat2]" \
  --set "data.options={num_clients: 4, unseen_clients: 1, samples_per_client: 16, unseen_only_groups: []}" \
  --set data.base_samples=0 --set base.kind=pretrained --set "budgets=[8]" --set eval.max_new_tokens=8 \
  --set "methods=[{name: lora, lr: 0.0002, epochs: 1, batch_size: 4}, \
{name: fedit, rounds: 2, fraction: 1.0, local_steps: 4, lr: 0.0002, batch_size: 4}]" --set output.plots=false
grep -h peak_cuda_mb "$WORK/qlora/costs.jsonl" 2>/dev/null | head -n 4

# 4. A step of fedpeft's runtime against a bare PEFT + AdamW loop, and peak memory against the estimate.
small="${SIZES[0]} ${SIZES[1]}" large="${SIZES[2]} ${SIZES[3]}"
for setting in "$MINILM classification float32 none $small" "$MINILM classification bfloat16 none $small" \
  "$GEMMA generation bfloat16 none $large" "$GEMMA generation bfloat16 4bit $large" \
  "$GEMMA generation float16 none $large"; do
  read -r model task dtype quantization batch length <<< "$setting"
  extra=()
  [ "$quantization" != none ] && extra=(--quantization "$quantization")
  step "step-$(basename "$model")-$dtype-$quantization" $PY benchmarks/step_overhead.py --model "$model" \
    --task "$task" --device "$DEVICE" --dtype "$dtype" "${extra[@]}" --batch "$batch" --length "$length" \
    --steps "${STEPS:-10}" --repeats "${REPEATS:-3}" --threads 4 --out "$OUT/step_overhead.jsonl"
done
$PY benchmarks/memory_estimate.py --measured "$OUT/step_overhead.jsonl" > "$OUT/memory.json"
cat "$OUT/memory.json"

# 5. Multi-client batched training: K clients' LoRA steps in one forward/backward (when this fedpeft has it).
if [ -f benchmarks/batch_clients.py ]; then
  step batch-clients $PY benchmarks/batch_clients.py --device "$DEVICE" --model "$MINILM" --clients 1 4 16 \
    --out "$OUT/batch_clients.jsonl"
fi

# 6. engine.workers 1 and 2 on the one GPU (two worker processes share it).
step parallel $PY benchmarks/parallel.py --preset smoke --set device=$DEVICE --set engine.workers_per_gpu=2 \
  --workers 1 2 --out "$OUT/parallel.json"

rm -rf "$WORK"
echo "=== done"
