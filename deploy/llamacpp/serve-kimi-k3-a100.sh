#!/usr/bin/env bash
# Kimi K3 on one 8x A100-80GB node with llama-server and the 1-bit UD-IQ1_S GGUF: the slow, cheap
# fallback. Flags are explained in deploy/README.md; kimi-k3-a100.yaml runs the same command.
#   bash deploy/llamacpp/serve-kimi-k3-a100.sh   (llama-server from a CUDA build of llama.cpp on PATH)
# Point MODEL at the first shard of the split GGUF; llama-server finds the other shards beside it.
set -euo pipefail

MODEL="${MODEL:-/models/Kimi-K3-GGUF/UD-IQ1_S/Kimi-K3-UD-IQ1_S-00001-of-00014.gguf}"
PORT="${PORT:-8080}"

# --ctx-size is shared by the slots: 131072 / --parallel 4 = 32k tokens of context per request.
# --threads-http: each connection holds one of a fixed pool of HTTP threads (default --parallel + 2) while
# kept alive, and each gateway replica's scraper keeps three (metrics, slots, health): 16 leaves room
# for the four slots, a queue, three replicas and Prometheus.
# --jinja and --slots are llama-server's defaults now, kept for older builds; --metrics is not a default.
# /slots shows each slot's prompt and generated text: keep this port inside the cluster (the gateway
# and Prometheus are its only clients), and --no-webui drops the chat UI nobody should reach here.
exec llama-server \
  -m "$MODEL" \
  --alias Kimi-K3-UD-IQ1_S \
  --host 0.0.0.0 \
  --port "$PORT" \
  --n-gpu-layers 999 \
  --split-mode layer \
  --tensor-split 1,1,1,1,1,1,1,1 \
  --parallel 4 \
  --threads-http 16 \
  --ctx-size 131072 \
  --jinja \
  --reasoning-format deepseek \
  --metrics \
  --slots \
  --no-webui
