#!/usr/bin/env bash
# Quick start, command 1: set up, build, generate the default model, serve it in the foreground.
# Extra arguments go to kimi-server (e.g. --listen 127.0.0.1:50052); KIMI_PRESET picks the model.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
case "${1:-}" in
  -h | --help)  # without the set-up: the server's flags if it is built
    echo "usage: scripts/run.sh [kimi-server flags]: install, build, generate \$KIMI_PRESET" \
      "(default k3-tiny) and serve it"
    if [ -x "$KIMI_BUILD/bin/kimi-server" ]; then exec "$KIMI_BUILD/bin/kimi-server" --help; fi
    exit 0
    ;;
esac
kimi_setup
preset=${KIMI_PRESET:-k3-tiny}  # any kimi-mkmodel preset
kimi_model "$preset"
if [ $# -eq 0 ]; then
  kimi_log "serving $KIMI_MODELS/$preset: gRPC on 127.0.0.1:50051, metrics on http://127.0.0.1:9464/metrics"
  kimi_log "try: grpcurl -plaintext -d '{\"text\":\"Hello\",\"max_tokens\":16}' 127.0.0.1:50051 kimi.v1.Generation/Generate"
  kimi_log "OpenAI API: $KIMI_BUILD/bin/kimi-gateway --backend 127.0.0.1:50051 (listens on 127.0.0.1:8000)"
else  # the flags may move the addresses: the server's start-up line names them
  kimi_log "serving $KIMI_MODELS/$preset with: $*"
fi
exec "$KIMI_BUILD/bin/kimi-server" --model "$KIMI_MODELS/$preset" "$@"
