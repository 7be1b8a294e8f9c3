#!/usr/bin/env bash
# kimi-server with device: cuda. Without a usable GPU (the CI machines) it must refuse at start-up:
# exit status 1 and one log line naming the device and the reason, never a crash or a server that
# claims to serve. With a GPU the whole-model checks are scripts/gpu-check.sh's, so this skips.
set -uo pipefail
build=${KIMI_BUILD_DIR:?}
model=${KIMI_MODEL:?}
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is present: see scripts/gpu-check.sh"; exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
timeout 60 "$build/bin/kimi-server" --model "$model" --listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 --device cuda:0 >"$log" 2>&1
rc=$?
cat "$log"
[ $rc -eq 1 ] || { echo "FAIL: exit status $rc, expected 1"; exit 1; }
grep -q "cannot start the CUDA backend on cuda:0" "$log" || { echo "FAIL: no reason logged"; exit 1; }
! grep -q "SERVING k3" "$log" || { echo "FAIL: claimed to serve"; exit 1; }
echo PASS
