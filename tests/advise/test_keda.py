"""The KEDA example scales the vLLM Deployment the deploy recipe creates, on the gauge the gateway
exports for the pool the default policy scales, within the policy's replica bounds."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.policy.load import load_policy

ROOT = Path(__file__).resolve().parents[2]


def test_the_scaled_object_reads_the_gauge_of_the_pool_and_targets_its_deployment() -> None:
    (scaled,) = yaml.safe_load_all(
        (ROOT / "deploy" / "kubernetes" / "keda" / "scaledobject-b300.yaml").read_text()
    )
    vllm = [d for d in yaml.safe_load_all((ROOT / "deploy" / "vllm" / "kimi-k3-b300.yaml").read_text()) if d]
    (deployment,) = [d for d in vllm if d["kind"] == "Deployment"]
    assert scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    scaling = load_policy(ROOT / "policies" / "default.yaml").backends["b300-vllm"].scaling
    assert scaling is not None
    assert scaled["spec"]["minReplicaCount"] == 0, "zero is a normal state"
    assert scaled["spec"]["maxReplicaCount"] == scaling.max_replicas
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert 'gateway_pool_desired_replicas{pool="b300-vllm"}' in trigger["metadata"]["query"]
    assert (trigger["metadata"]["metricType"], trigger["metadata"]["threshold"]) == ("AverageValue", "1")
