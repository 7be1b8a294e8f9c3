#!/usr/bin/env bash
# Quick start, command 2: set up, build, then the whole test suite through ctest.
# Extra arguments go to ctest (e.g. -R kda, -L unit).
set -euo pipefail
source "$(dirname "$0")/setup.sh"
kimi_setup
for preset in kimi-linear-tiny k3-tiny kimi-linear-small k3-mini; do
  kimi_model "$preset"
done
cd "$KIMI_BUILD"
exec ctest --output-on-failure -j "$(nproc)" "$@"
