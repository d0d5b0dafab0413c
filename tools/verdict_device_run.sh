#!/usr/bin/env bash
# The verdict service on a lent GPU machine: the GPU and sandbox tests, then tools/verdict_bench.py
# (runner start, then the corpus), this tree beside an earlier one unpacked in .baseline/.
# Usage, from the repository root on the GPU machine (wheels for what its image lacks in .whl/):
#   [PHASE=tests|ready|corpus|all] tools/verdict_device_run.sh OUTDIR
set -u
out=${1:?usage: tools/verdict_device_run.sh OUTDIR}
phase=${PHASE:-all}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"
python3 -m pip install -q --no-index --no-deps .whl/*.whl > "$out/pip.log" 2>&1 || tail -3 "$out/pip.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
start=$(date +%s)
if [ "$phase" = tests ] || [ "$phase" = all ]; then
  timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rs \
    tests/eval/test_gpu.py tests/eval/test_sandbox.py > "$out/tests.log" 2>&1
  echo "tests: rc=$? in $(( $(date +%s) - start )) s"
  grep -E "passed|failed|error" "$out/tests.log" | tail -3
  grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -30
fi
if [ "$phase" = ready ] || [ "$phase" = all ]; then
  timeout "${READY_TIMEOUT:-240}" python3 tools/verdict_bench.py --device cuda:0 --phases ready \
    --ready "${READY:-30}" --baseline-ready "${BASELINE_READY:-8}" ${BASELINE:+--baseline "$BASELINE"} \
    --out "$out/ready" > "$out/ready.log" 2>&1
  echo "ready: rc=$? after $(( $(date +%s) - start )) s"
  tail -25 "$out/ready.log"
fi
if [ "$phase" = corpus ] || [ "$phase" = all ]; then
  # what is left of the call's ${CALL_S:-580} s, less a minute for the worker and the report
  left=$(( ${CALL_S:-580} - ($(date +%s) - start) ))
  timeout "$left" python3 tools/verdict_bench.py --device cuda:0 --phases corpus \
    --budget-s "$(( left - 60 ))" --out "$out/corpus" > "$out/corpus.log" 2>&1
  echo "corpus: rc=$? after $(( $(date +%s) - start )) s"
  tail -60 "$out/corpus.log"
fi
