#!/usr/bin/env bash
# Kimi K3 on one 8x GPU node with SGLang, beside (or instead of) the vLLM pool in deploy/vllm/.
# The gateway backend is `dialect: sglang` (see policy.yaml here): it scrapes /metrics for
# sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage, sglang:gen_throughput and the
# TTFT histogram, and reads reasoning from `reasoning_content`.
#   pip install -r deploy/sglang/requirements.txt && bash deploy/sglang/serve-kimi-k3.sh
set -euo pipefail

MODEL="${MODEL:-moonshotai/Kimi-K3}"
PORT="${PORT:-30000}"

# --enable-metrics: without it /metrics is absent and the gateway routes on its own counts only.
# --enable-cache-report: without it SGLang never sends prompt_tokens_details.cached_tokens, and the gateway
#   prices every cached prompt token as fresh prefill.
# --max-running-requests 64: the same batch ceiling as the vLLM pool, so the two price alike per token.
# /health runs a one-token generation (>= 1 s): policy.yaml's health_timeout_s sits above it. Keep
# SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION at its default (true): a 200 then proves the engine generates.
exec python -m sglang.launch_server \
  --model-path "$MODEL" \
  --served-model-name moonshotai/Kimi-K3 \
  --host 0.0.0.0 \
  --port "$PORT" \
  --trust-remote-code \
  --tp-size 8 \
  --reasoning-parser kimi_k3 \
  --tool-call-parser kimi_k3 \
  --enable-metrics \
  --enable-cache-report \
  --max-running-requests 64 \
  --context-length 131072 \
  --mem-fraction-static 0.90
