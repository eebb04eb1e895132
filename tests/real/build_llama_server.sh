#!/usr/bin/env bash
# Builds llama.cpp's own C++ `llama-server` (what deploy/llamacpp runs) once, from the llama.cpp sources
# that the llama-cpp-python sdist vendors, and caches the binary outside the repo. Prints its path on
# stdout (everything else goes to stderr), so callers can write: LLAMA_SERVER=$(bash build_llama_server.sh).
# Idempotent: with the binary cached a run takes a moment. Works from nothing: installs cmake and a C++
# compiler with apt-get where they are missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

# The llama.cpp vendored by this llama-cpp-python release; the binary is named after it.
LLAMA_CPP_PYTHON_VERSION=0.3.36
# A native build (-march=native) dies with "Illegal instruction" on other CPUs: build for a fixed ISA.
# Static libraries make the binary one file that can be cached and moved; no network code at all
# (no curl, no OpenSSL, no web UI download): the tests and the deployment only serve a local GGUF.
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
)

CACHE="${GATEWAY_CACHE:-$HOME/.cache/gateway}"
BIN="$CACHE/bin/llama-server-$LLAMA_CPP_PYTHON_VERSION"
BUILD_LOG="$CACHE/llama-server-build.log"
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf '[build_llama_server] %s\n' "$*" >&2; }

if [ -x "$BIN" ]; then
  say "reusing cached $BIN"
  printf '%s\n' "$BIN"
  exit 0
fi

if ! command -v cmake >/dev/null || ! command -v c++ >/dev/null || ! command -v make >/dev/null; then
  say "installing cmake and a C++ compiler (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ make >/dev/null
fi
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python

mkdir -p "$CACHE/bin"
work=$(mktemp -d)
pid=
# Stopping this script stops the compiler too, and leaves nothing half-built behind.
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"; }
trap 'cleanup; exit 130' INT TERM
trap cleanup EXIT

say "fetching the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (its vendor/llama.cpp is what gets built)"
out=$("$PY" -m pip download --quiet --no-binary :all: --no-deps -d "$work" \
  "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" 2>&1) || { printf '%s\n' "$out" >&2; exit 1; }
tar -xzf "$work"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz -C "$work"
src="$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
started=$(date +%s)
say "building llama-server (portable, only that target, under nice; ~10 min on 2 cores), log: $BUILD_LOG"
(
  nice -n 19 cmake -S "$src" -B "$work/build" "${generator[@]}" "${CMAKE_FLAGS[@]}" &&
    nice -n 19 cmake --build "$work/build" --target llama-server --parallel "$(nproc)"
) >"$BUILD_LOG" 2>&1 &
pid=$!
next_report=$((started + 30))
while kill -0 "$pid" 2>/dev/null; do
  sleep 1
  if [ "$(date +%s)" -ge "$next_report" ]; then
    next_report=$((next_report + 30))
    # ninja prints [done/total] per compiled file, make prints [ NN%]: the latest one is the progress.
    step=$(grep -o -e '^\[[0-9]*/[0-9]*\]' -e '^\[ *[0-9]*%\]' "$BUILD_LOG" | tail -n1 || true)
    say "  still building: $(($(date +%s) - started)) s ${step:-(configuring)}"
  fi
done
rc=0
wait "$pid" || rc=$?
pid=
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$BUILD_LOG" >&2
  say "build failed (exit $rc); full log: $BUILD_LOG"
  exit "$rc"
fi
built="$work/build/bin/llama-server"
"$built" --version >/dev/null 2>&1 || { say "the built $built does not run"; exit 1; }
# Copied next to the cache, then renamed: a killed build never leaves a half-written binary in the cache.
cp "$built" "$BIN.partial"
mv "$BIN.partial" "$BIN"
say "built $BIN in $(($(date +%s) - started)) s"
printf '%s\n' "$BIN"
