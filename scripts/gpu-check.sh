#!/usr/bin/env bash
# GPU check of the CUDA backend, for a machine with an NVIDIA GPU (sized for one H200 in under 10
# minutes): builds the CUDA tests and benchmark (no gRPC needed: -DKIMI_WITH_SERVER=OFF), makes the
# preset models if missing, runs every CUDA kernel test against the CPU kernels and the whole-model
# tests against the CPU engine, then the benchmark, and prints a short report:
#   PASS/FAIL per test suite (kernel or model test), decode tokens/s at batch 1/32/128, GEMM
#   TFLOP/s as a ratio to cuBLASLt's best, decode-step HBM bandwidth as a ratio to peak, KDA
#   prefill time against sequence length.
# Logs of every step are kept in $KIMI_GPU_BUILD/logs; a failing step prints its last lines.
# Usage: bash scripts/gpu-check.sh [--quick]      Exit status: 0 when everything passed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KIMI_GPU_BUILD:-$root/build-gpu}
models=${KIMI_MODELS:-$root/models}
logs=$build/logs
quick=""
[ "${1:-}" = "--quick" ] && quick="--quick"
mkdir -p "$logs" "$models"
start=$(date +%s)
status=0

say() { printf '%s\n' "$*"; }
elapsed() { echo $(($(date +%s) - start)); }
# step NAME SECONDS CMD...: runs CMD under a timeout with its output in $logs/NAME.log.
step() {
  local name=$1 secs=$2
  shift 2
  if timeout --kill-after=10 "$secs" "$@" >"$logs/$name.log" 2>&1; then
    return 0
  else
    local rc=$?
    [ $rc -eq 124 ] && say "FAIL $name: timed out after ${secs}s" || say "FAIL $name (exit $rc)"
    tail -n 15 "$logs/$name.log" | sed 's/^/    /'
    return 1
  fi
}

gpu=""
command -v nvidia-smi >/dev/null &&
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1) || true
say "gpu-check: ${gpu:-no GPU visible (nvidia-smi); the tests will skip}"

# 1. Configure and build (ninja if present).
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  step configure 240 cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKIMI_WITH_SERVER=OFF || { say "gpu-check: FAIL (configure) after $(elapsed)s"; exit 1; }
fi
cmake --build "$build" --target help 2>/dev/null | grep -q kernels_cuda_test || {
  say "FAIL configure: nvcc not found (CUDA toolkit in /usr/local/cuda?)"; exit 1; }
step build 420 cmake --build "$build" --parallel "$(nproc)" --target kernels_cuda_test \
  engine_cuda_test kimi-gpu-bench kimi-mkmodel || { say "gpu-check: FAIL (build) after $(elapsed)s"; exit 1; }
say "build: ok ($(elapsed)s)"

# 2. Models (the same generator and seed as ./scripts/test.sh; cl100k ranks when present).
vocab=()
[ -s "$models/cl100k_base.tiktoken" ] && vocab=(--tiktoken "$models/cl100k_base.tiktoken")
for preset in k3-tiny kimi-linear-small k3-mini; do
  if [ ! -f "$models/$preset/config.json" ]; then
    step "model-$preset" 240 "$build/bin/kimi-mkmodel" --preset "$preset" --out "$models/$preset" \
      --seed 1 "${vocab[@]}" || status=1
  fi
done

# 3. Tests: one line per test suite.
# summarize LOG: PASS/FAIL/SKIP per suite from GoogleTest's output.
summarize() {
  awk '
    /^\[       OK \]/ { split($4, a, "."); ok[a[1]]++; seen[a[1]] = 1 }
    /^\[  FAILED  \] [A-Za-z0-9_\/]+\.[A-Za-z0-9_\/]+ \(/ { split($4, a, "."); bad[a[1]] = bad[a[1]] " " a[2]; seen[a[1]] = 1 }
    /^\[  SKIPPED \] [A-Za-z0-9_\/]+\.[A-Za-z0-9_\/]+ \(/ { split($4, a, "."); skip[a[1]]++; seen[a[1]] = 1 }
    END {
      for (s in seen) {
        if (s in bad) printf "FAIL %-28s%s\n", s, bad[s];
        else if (ok[s] > 0) printf "PASS %-28s %d tests%s\n", s, ok[s], (skip[s] ? sprintf(", %d skipped", skip[s]) : "");
        else printf "SKIP %-28s %d tests\n", s, skip[s];
      }
    }' "$1" | sort -k2
}
export KIMI_SOURCE_DIR=$root KIMI_MODELS=$models
for t in kernels_cuda_test engine_cuda_test; do
  secs=150
  [ "$t" = engine_cuda_test ] && secs=300
  if ! step "$t" "$secs" "$build/tests/$t" --gtest_color=no; then status=1; fi
  summarize "$logs/$t.log"
  # The reason of the first skip, if any (GoogleTest prints it on the line after "Skipped").
  grep -m1 -A1 ': Skipped$' "$logs/$t.log" | tail -n 1 | sed 's/^/    first skip: /' || true
done

# 4. Benchmarks.
if [ -z "$gpu" ]; then
  say "gpu-check: NO GPU -- built and ran the tests (skipped), no benchmarks ($(elapsed)s)"
  exit 3
fi
say "benchmarks (ratios against the same GPU's cuBLASLt best / peak HBM):"
if step bench 200 "$build/bin/kimi-gpu-bench" --models "$models" $quick; then
  sed 's/^/  /' "$logs/bench.log"
else
  status=1
fi

if [ $status -eq 0 ]; then
  say "gpu-check: PASS ($(elapsed)s)"
else
  say "gpu-check: FAIL ($(elapsed)s; logs in $logs)"
fi
exit $status
