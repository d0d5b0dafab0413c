#!/usr/bin/env bash
# One session on a lent GPU machine for the sandbox: does CUDA start inside it, the GPU and
# sandbox tests, and tools/sandbox_bench.py on the GPU. Logs and figures go to OUTDIR.
# Usage, from the repository root on the GPU machine (wheels for what its image lacks in .whl/):
#   tools/sandbox_device_run.sh OUTDIR
set -u
out=${1:?usage: tools/sandbox_device_run.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
python3 -c "
from specgen.eval import sandbox
print('probe:', sandbox.probe()); print('cuda:', sandbox.probe_cuda('0'))" 2>&1 | tee "$out/probe.txt"
start=$(date +%s)
timeout "${TESTS_TIMEOUT:-330}" python3 -m pytest -q -p no:cacheprovider -rs \
  tests/eval/test_gpu.py tests/eval/test_sandbox.py tests/runtime/test_trust.py > "$out/tests.log" 2>&1
echo "tests: rc=$? in $(( $(date +%s) - start )) s"
grep -E "passed|failed|error" "$out/tests.log" | tail -3
grep -E "^(FAILED|ERROR|SKIPPED)" "$out/tests.log" | head -20
start=$(date +%s)
timeout "${BENCH_TIMEOUT:-200}" python3 tools/sandbox_bench.py --device cuda:0 --rounds "${ROUNDS:-5}" \
  --out "$out/sandbox_bench.json" > "$out/bench.log" 2>&1
echo "sandbox_bench: rc=$? in $(( $(date +%s) - start )) s"
tail -25 "$out/bench.log"
