# Shared set-up for run.sh and test.sh (sourced, not run): install missing Debian packages,
# configure and build with Ninja + ccache, generate the models the caller asks for.
# Idempotent and quiet when there is nothing to do.

KIMI_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KIMI_BUILD=${KIMI_BUILD:-$KIMI_ROOT/build}
KIMI_MODELS=${KIMI_MODELS:-$KIMI_ROOT/models}

# Everything the build, the tests and the tools use, from Debian 12.
KIMI_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libabsl-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev libyaml-cpp-dev libspdlog-dev libcpp-httplib-dev
  python3 python3-numpy python3-torch python3-yaml
  libpcre2-dev
  libssl-dev openssl prometheus
  openmpi-bin libopenmpi-dev
  libdnnl-dev libopenblas-dev
)

kimi_log() { printf '[kimi] %s\n' "$*" >&2; }

kimi_install_packages() {
  local missing=()
  for p in "${KIMI_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # Node.js may come from elsewhere (NodeSource bundles npm and conflicts with Debian's npm).
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  kimi_log "installing ${#missing[@]} Debian packages: ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

kimi_build() {
  if [ ! -f "$KIMI_BUILD/build.ninja" ]; then
    kimi_log "configuring $KIMI_BUILD (Ninja, RelWithDebInfo)"
    cmake -S "$KIMI_ROOT" -B "$KIMI_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  kimi_log "building"
  # Two jobs per core would swap on small machines with nvcc; ninja's default is fine here.
  ninja -C "$KIMI_BUILD" | grep -vE '^\[[0-9]+/[0-9]+\] ' || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || { kimi_log "build failed"; return 1; }
}

# kimi_model PRESET: generates models/PRESET unless it exists and was made by the same generator
# from the same vocabulary (cl100k_base's ranks, from scripts/fetch_vocab.sh).
kimi_model() {
  local preset=$1 dir=$KIMI_MODELS/$1 vocab=$KIMI_MODELS/cl100k_base.tiktoken
  local stamp
  stamp=$(cat "$KIMI_ROOT"/engine/synthetic_model.cc "$KIMI_ROOT"/engine/tensor_set.cc \
    "$KIMI_ROOT"/tokenizer/templates/k3_chat_template.jinja "$vocab" | sha1sum | cut -c1-16)
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then
    return 0
  fi
  # Only a generated preset's directory is ever replaced: the name is checked before anything is
  # removed (KIMI_PRESET=.. would have removed the models' parent, and a real checkpoint under
  # models/, having no stamp, would have been deleted).
  case "$preset" in
    kimi-linear-tiny | kimi-linear-small | k3-tiny | k3-mini) ;;
    *)
      echo "[kimi] unknown preset '$preset' (kimi-linear-tiny, kimi-linear-small, k3-tiny, k3-mini)" >&2
      return 1
      ;;
  esac
  if [ -e "$dir" ] && [ ! -f "$dir/.stamp" ]; then
    echo "[kimi] $dir exists and was not generated here (no .stamp): leaving it; move it or choose another preset" >&2
    return 1
  fi
  kimi_log "generating model $preset in $dir"
  # Generated beside the target and moved into place whole: an interrupted run leaves only the
  # .generating directory, which the next run replaces.
  local tmp=$dir.generating log
  rm -rf "$tmp"
  if ! log=$("$KIMI_BUILD/bin/kimi-mkmodel" --preset "$preset" --out "$tmp" --seed 1 \
    --tiktoken "$vocab" 2>&1); then
    echo "$log" >&2
    rm -rf "$tmp"
    return 1
  fi
  echo "$stamp" >"$tmp/.stamp"
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

kimi_setup() {
  kimi_install_packages || return 1
  "$KIMI_ROOT/scripts/fetch_vocab.sh" || return 1
  kimi_build || return 1
}
