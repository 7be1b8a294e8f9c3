#!/usr/bin/env bash
# Quick start, command 1: set up, build, generate the default model, serve it in the foreground.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
kimi_setup
DEFAULT_MODEL=${KIMI_PRESET:-k3-tiny}  # any kimi-mkmodel preset
kimi_model "$DEFAULT_MODEL"
if [ ! -x "$KIMI_BUILD/bin/kimi-server" ]; then
  kimi_log "kimi-server is not built yet (the gRPC server issue adds it); the model is at $KIMI_MODELS/$DEFAULT_MODEL"
  exit 1
fi
kimi_log "gRPC on 127.0.0.1:50051, metrics on http://127.0.0.1:9464/metrics"
kimi_log "try: grpcurl -plaintext -d '{\"text\":\"Hello\",\"max_tokens\":16}' 127.0.0.1:50051 kimi.v1.Generation/Generate"
exec "$KIMI_BUILD/bin/kimi-server" --model "$KIMI_MODELS/$DEFAULT_MODEL" "$@"
