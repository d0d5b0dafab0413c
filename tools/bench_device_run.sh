#!/usr/bin/env bash
# `specgen bench` on a lent GPU machine: 24 generated problem-turns, the four modes side by side,
# with the `draft` fork model and then (if time is left) `named`. Logs, results.json, report.md and
# the plots go to OUTDIR (flat: the device tool returns few files, two folders deep at most).
# CLOCK=virtual (the bench's default clock, speed 1) measures every program once on the GPU and
# simulates the modes; its results.json can be simulated again elsewhere with `bench --measured`.
# CLOCK=wall (the default here) runs the real loop at SPEED (10 unless set).
# Usage, from the repository root on the GPU machine (wheels for what its image lacks in .whl/):
#   [CLOCK=wall|virtual] [SPEED=X] [EVAL_TIMEOUT=S] [MODELS="draft named"] [MODES=specgen,sequential] tools/bench_device_run.sh OUTDIR [WORKERS_PER_GPU]
set -u
out=${1:?usage: tools/bench_device_run.sh OUTDIR [WORKERS_PER_GPU]}
per_gpu=${2:-8}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"
python3 -m pip install -q --no-index --no-deps .whl/*.whl > "$out/pip.log" 2>&1 || tail -3 "$out/pip.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ')
devices=$(for g in $gpus; do for _ in $(seq "$per_gpu"); do printf 'cuda:%s,' "$g"; done; done)
devices=${devices%,}
budget=${BENCH_BUDGET_S:-540}
start=$(date +%s)
for model in ${MODELS:-draft named}; do
  left=$(( budget - ($(date +%s) - start) ))
  [ "$left" -gt 120 ] || { echo "$model: skipped, ${left} s left"; break; }
  work=/tmp/bench-$model
  timeout "$left" python3 -m specgen.cli bench --clock "${CLOCK:-wall}" --generate 8 --turns 3 --concurrency 8 \
    --speed "${SPEED:-$([ "${CLOCK:-wall}" = virtual ] && echo 1 || echo 10)}" \
    --seed 1 --fork-model "$model" --devices "$devices" ${EVAL_TIMEOUT:+--eval-timeout "$EVAL_TIMEOUT"} \
    ${MODES:+--modes "$MODES"} \
    --out "$work" > "$out/$model.log" 2>&1
  echo "$model: rc=$? after $(( $(date +%s) - start )) s"
  for f in results.json report.md measured.jsonl; do [ -f "$work/$f" ] && cp "$work/$f" "$out/$model-$f"; done
  tail -20 "$out/$model.log"
done
