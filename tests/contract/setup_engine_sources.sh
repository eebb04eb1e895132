#!/usr/bin/env bash
# Unpacks the engines' own sources at the versions docs/contracts/*.yaml pin, so tests/contract can check that
# every citation is a line of the pinned tree (without them that test skips). Cached outside the repo, like
# llama-server; prints the folder to export as ENGINE_SOURCES. Idempotent: a cached tree takes a moment.
#
#   vllm/src/vllm        the vLLM 0.33.0 wheel's Python sources
#   sglang/src/sglang    the SGLang 0.5.23 wheel's Python sources
#   llamacpp/src         llama.cpp as the llama-cpp-python 0.3.36 sdist vendors it (commit 0c1e570...)
set -euo pipefail
cd "$(dirname "$0")/../.."

VLLM=0.33.0
SGLANG=0.5.23
LLAMA_CPP_PYTHON=0.3.36
CACHE="${GATEWAY_CACHE:-$HOME/.cache/gateway}"
DEST="$CACHE/engines-vllm$VLLM-sglang$SGLANG-llamacpppython$LLAMA_CPP_PYTHON"
say() { printf '[engine sources] %s\n' "$*" >&2; }

if [ -d "$DEST/vllm/src/vllm" ] && [ -d "$DEST/sglang/src/sglang" ] && [ -d "$DEST/llamacpp/src" ]; then
  say "reusing $DEST"
  echo "$DEST"
  exit 0
fi
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say "fetching vllm==$VLLM and sglang==$SGLANG wheels and the llama-cpp-python==$LLAMA_CPP_PYTHON sdist"
for spec in "--only-binary=:all: vllm==$VLLM" "--only-binary=:all: sglang==$SGLANG" \
  "--no-binary=:all: llama-cpp-python==$LLAMA_CPP_PYTHON"; do
  # shellcheck disable=SC2086  # the spec is two words on purpose
  out=$("$PY" -m pip download --quiet --no-deps -d "$work" $spec 2>&1) || { printf '%s\n' "$out" >&2; exit 1; }
done
mkdir -p "$work/tree/vllm/src" "$work/tree/sglang/src" "$work/tree/llamacpp"
# Only the sources: the wheels' compiled kernels are most of their size and cite nothing.
"$PY" - "$work" <<'PY'
import sys, zipfile
from pathlib import Path
work = Path(sys.argv[1])
for wheel, package in ((next(work.glob("vllm-*.whl")), "vllm"), (next(work.glob("sglang-*.whl")), "sglang")):
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith(package + "/") and not n.endswith((".so", ".cubin"))]
        archive.extractall(work / "tree" / package / "src", names)
PY
tar -xzf "$work"/llama_cpp_python-"$LLAMA_CPP_PYTHON".tar.gz -C "$work"
mv "$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp" "$work/tree/llamacpp/src"
mkdir -p "$CACHE"
rm -rf "$DEST.partial"
mv "$work/tree" "$DEST.partial"
mv "$DEST.partial" "$DEST"  # whole or not at all: a killed run never leaves half a tree to reuse
say "unpacked in $DEST"
echo "$DEST"
