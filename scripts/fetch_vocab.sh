#!/usr/bin/env bash
# Installs the npm packages the tokenizer tests and benchmark need (package.json + package-lock.json
# at the repo root, into node_modules/) and writes cl100k_base's ranks from the npm `tiktoken`
# package in tiktoken format to models/cl100k_base.tiktoken (the base vocabulary of the synthetic
# presets: kimi-mkmodel --tiktoken models/cl100k_base.tiktoken). Nothing it makes is committed.
# Idempotent and quiet when there is nothing to do. Needs node and npm (Debian: nodejs, npm).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
models=${KIMI_MODELS:-$root/models}
log() { printf '[kimi] %s\n' "$*" >&2; }

command -v node >/dev/null && command -v npm >/dev/null || {
  log "fetch_vocab: node and npm are needed (apt-get install nodejs npm)"
  exit 1
}

# npm ci only when the installed tree does not match the lock file.
stamp=$root/node_modules/.kimi-lock-sha
want=$(sha1sum "$root/package-lock.json" | cut -c1-40)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] ||
   [ ! -f "$root/node_modules/tiktoken/encoders/cl100k_base.json" ]; then
  log "installing npm packages (package-lock.json)"
  (cd "$root" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$want" >"$stamp"
fi

out=$models/cl100k_base.tiktoken
if [ ! -s "$out" ] || [ "$root/node_modules/.kimi-lock-sha" -nt "$out" ]; then
  log "writing $out"
  node "$root/tokenizer/npm/tiktoken_ranks.js" cl100k_base "$out"
fi
