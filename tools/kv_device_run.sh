#!/usr/bin/env bash
# One session on a lent GPU machine for the KV-transfer work: build the extension in place, run
# tests/kv (GPU tests included), run tools/kv_bench.py. Logs and figures go to OUTDIR.
# Usage, from the repository root on the GPU machine (PYTHONPATH must reach the repository):
#   tools/kv_device_run.sh OUTDIR [kv_bench.py arguments...]
set -u
out=${1:?usage: tools/kv_device_run.sh OUTDIR [bench args...]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi topo -m > "$out/topo.txt" 2>&1
nvidia-smi >> "$out/topo.txt" 2>&1
start=$(date +%s)
if ! SPECGEN_BUILD_JOBS=16 python3 setup.py build_ext --inplace > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
start=$(date +%s)
timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest tests/kv -q -p no:cacheprovider -rs > "$out/tests.log" 2>&1
echo "tests/kv: rc=$? in $(( $(date +%s) - start )) s"
grep -E "passed|failed|error" "$out/tests.log" | tail -5
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -20
timeout "${BENCH_TIMEOUT:-360}" python3 tools/kv_bench.py --out "$out/kv_bench.json" "$@" > "$out/bench.log" 2>&1
echo "kv_bench: rc=$?"
grep -v -E "^ *(16K|64K|256K|1M) x" "$out/bench.log" | tail -60
