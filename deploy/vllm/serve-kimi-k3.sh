#!/usr/bin/env bash
# Kimi K3 on one 8x B300 node with vLLM: the fast, expensive pool the gateway prefers while it has
# SLO-safe headroom. Flags are explained in deploy/README.md; kimi-k3-b300.yaml runs the same command.
#   pip install -r deploy/vllm/requirements.txt && bash deploy/vllm/serve-kimi-k3.sh
# Expect ~27 minutes from start to a 200 on /health (1.56 TB of weights to load, kernels to warm up).
set -euo pipefail

MODEL="${MODEL:-moonshotai/Kimi-K3}"  # a Hub id, or a local copy of it (ships MXFP4 routed experts)
PORT="${PORT:-8000}"

# 64 concurrent sequences: per-stream decode falls roughly as n^-0.25 with batch size, so from 92 tok/s
# at one stream, 64 streams still give ~92 * 64^-0.25 = ~33 tok/s each (above a 30 tok/s SLO floor)
# while the pool's aggregate output grows ~20x, which is what makes a GPU-hour token cheap.
exec vllm serve "$MODEL" \
  --served-model-name moonshotai/Kimi-K3 \
  --host 0.0.0.0 \
  --port "$PORT" \
  --trust-remote-code \
  --tensor-parallel-size 8 \
  --reasoning-parser kimi_k3 \
  --enable-auto-tool-choice \
  --tool-call-parser kimi_k3 \
  --enable-prefix-caching \
  --enable-prompt-tokens-details \
  --max-num-seqs 64 \
  --max-model-len 131072 \
  --gpu-memory-utilization 0.92
