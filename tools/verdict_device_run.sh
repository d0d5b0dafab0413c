#!/usr/bin/env bash
# The verdict service on a lent GPU machine: the GPU and sandbox tests, then tools/verdict_bench.py
# (runner start, the judge's cost beside an earlier tree unpacked in .baseline/, the corpus).
# Usage, from the repository root on the GPU machine (wheels for what its image lacks in .whl/):
#   [PHASES=tests,ready,cost,corpus] [WORKERS=N[,M...]] [EXT_CACHE=DIR] [COST_PROBLEMS=a,b] \
#     tools/verdict_device_run.sh OUTDIR
# WORKERS=4,6 judges the corpus with 4 workers, then with 6, in one process; EXT_CACHE keeps the
# corpus's extension builds between calls on a warm machine (the builds are reported apart).
set -u
out=${1:?usage: tools/verdict_device_run.sh OUTDIR}
phases=",${PHASES:-tests,ready,cost,corpus},"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"
python3 -m pip install -q --no-index --no-deps .whl/*.whl > "$out/pip.log" 2>&1 || tail -3 "$out/pip.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
start=$(date +%s)
has() { [[ "$phases" == *",$1,"* ]]; }
if has tests; then
  timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -v -p no:cacheprovider -rs --durations=25 \
    ${TESTS:-tests/eval/test_gpu.py tests/eval/test_sandbox.py tests/eval/test_device_turns.py} \
    > "$out/tests.log" 2>&1
  echo "tests: rc=$? in $(( $(date +%s) - start )) s"
  grep -E "passed|failed|error" "$out/tests.log" | tail -3
  grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -30
fi
for phase in ready cost; do
  has "$phase" || continue
  # PHASE_TIMEOUT, or else what is left of the call's ${CALL_S:-580} s
  timeout "${PHASE_TIMEOUT:-$(( ${CALL_S:-580} - ($(date +%s) - start) ))}" \
    python3 tools/verdict_bench.py --device cuda:0 --phases "$phase" \
    --ready "${READY:-30}" --baseline-ready "${BASELINE_READY:-8}" \
    --cost-repeats "${COST_REPEATS:-3}" ${BASELINE:+--baseline "$BASELINE"} \
    ${COST_PROBLEMS:+--cost-problems "$COST_PROBLEMS"} \
    --out "$out/$phase" > "$out/$phase.log" 2>&1
  echo "$phase: rc=$? after $(( $(date +%s) - start )) s"
  tail -25 "$out/$phase.log"
done
if has corpus; then
  # what is left of the call's ${CALL_S:-580} s, less a minute for the worker and the report
  left=$(( ${CALL_S:-580} - ($(date +%s) - start) ))
  timeout "$left" python3 tools/verdict_bench.py --device cuda:0 --phases corpus \
    --workers "${WORKERS:-1}" ${EXT_CACHE:+--ext-cache "$EXT_CACHE"} ${BASELINE:+--baseline "$BASELINE"} --budget-s "$(( left - 60 ))" --out "$out/corpus" \
    > "$out/corpus.log" 2>&1
  echo "corpus: rc=$? after $(( $(date +%s) - start )) s"
  tail -60 "$out/corpus.log"
fi
