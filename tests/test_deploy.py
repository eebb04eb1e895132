"""The deployment recipes in deploy/ hold together offline: every manifest is a valid Kubernetes object,
the scripts and manifests run the same flags, and policies/real-pools.yaml points at what they expose."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gateway.policy.load import load_policy

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
REAL_POOLS = ROOT / "policies" / "real-pools.yaml"
# Validated against this release's official schemas (bundled in kubernetes-validate, so offline).
KUBERNETES_VERSION = "1.33"
VLLM_SCRIPT = DEPLOY / "vllm" / "serve-kimi-k3.sh"
VLLM_MANIFEST = DEPLOY / "vllm" / "kimi-k3-b300.yaml"
LLAMACPP_SCRIPT = DEPLOY / "llamacpp" / "serve-kimi-k3-a100.sh"
LLAMACPP_MANIFEST = DEPLOY / "llamacpp" / "kimi-k3-a100.yaml"
COLD_BOOT_ALLOWANCE_S = 40 * 60  # the B300 pool takes ~27 min to boot; leave a wide margin


def yaml_files() -> list[Path]:
    return sorted(p for pattern in ("*.yaml", "*.yml") for p in DEPLOY.rglob(pattern))


def documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def kubernetes_objects(path: Path) -> list[dict[str, Any]]:
    # deploy/ may also hold compose files or Prometheus configs: only objects with a kind are validated.
    return [d for d in documents(path) if isinstance(d, dict) and "apiVersion" in d and "kind" in d]


def objects_of(path: Path, kind: str) -> list[dict[str, Any]]:
    return [o for o in kubernetes_objects(path) if o["kind"] == kind]


def script_flags(path: Path) -> set[str]:
    return set(re.findall(r"(?m)^\s+(--[a-z][a-z0-9-]*)", path.read_text()))


def container(manifest: Path) -> dict[str, Any]:
    (deployment,) = objects_of(manifest, "Deployment")
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = main
    return result


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_deploy_holds_the_recipes() -> None:
    assert {VLLM_MANIFEST, LLAMACPP_MANIFEST} <= set(yaml_files())


def is_builtin_api(api_version: str) -> bool:
    """Core ("v1"), unqualified ("apps/v1") or *.k8s.io groups; anything else is a custom resource."""
    group = api_version.rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_validates_against_the_kubernetes_schemas(path: Path) -> None:
    assert documents(path), f"{path} has no YAML documents"
    for obj in kubernetes_objects(path):
        where = f"{path.name}: {obj['kind']}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            # Custom resources (a Prometheus ServiceMonitor, say) have no official schema to check.
            if is_builtin_api(obj["apiVersion"]):
                pytest.fail(f"{where}: {exc.message}")


@pytest.mark.parametrize("manifest", [VLLM_MANIFEST, LLAMACPP_MANIFEST], ids=["vllm", "llamacpp"])
def test_pool_deployment_gets_eight_gpus_shared_memory_and_health_probes(manifest: Path) -> None:
    main = container(manifest)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "8"
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    (deployment,) = objects_of(manifest, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "persistentVolumeClaim" in volumes[mounts["/models"]]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"]["path"] == "/health", probe


def test_vllm_startup_probe_outlasts_the_cold_boot() -> None:
    probe = container(VLLM_MANIFEST)["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= COLD_BOOT_ALLOWANCE_S


@pytest.mark.parametrize("manifest", [VLLM_MANIFEST, LLAMACPP_MANIFEST], ids=["vllm", "llamacpp"])
def test_service_selects_the_pods_and_exposes_the_container_port(manifest: Path) -> None:
    (deployment,) = objects_of(manifest, "Deployment")
    (service,) = objects_of(manifest, "Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    port_names = {p["name"] for p in container(manifest)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


@pytest.mark.parametrize(
    ("script", "flags"),
    [
        (
            VLLM_SCRIPT,
            [
                "--tensor-parallel-size 8",
                "--reasoning-parser kimi_k3",
                "--enable-prefix-caching",
                "--enable-prompt-tokens-details",  # else cached tokens read 0 (docs/contracts/vllm.yaml)
                "--max-num-seqs 64",
                "--max-model-len",
                "--gpu-memory-utilization",
                "--served-model-name",
                "--trust-remote-code",
            ],
        ),
        (
            LLAMACPP_SCRIPT,
            [
                "--n-gpu-layers 999",
                "--split-mode layer",
                "--tensor-split 1,1,1,1,1,1,1,1",
                "--parallel 4",
                "--threads-http 16",  # room for the gateways' scrapers (deploy/README.md)
                "--ctx-size",
                "--metrics",
                "--slots",
                "--reasoning-format deepseek",
                "--jinja",
                "--alias",
            ],
        ),
    ],
    ids=["vllm", "llamacpp"],
)
def test_shell_recipe_carries_the_key_flags(script: Path, flags: list[str]) -> None:
    text = " ".join(script.read_text().split())
    missing = [flag for flag in flags if flag not in text]
    assert not missing, f"{script.name} lacks {missing}"
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize(
    ("script", "manifest"),
    [(VLLM_SCRIPT, VLLM_MANIFEST), (LLAMACPP_SCRIPT, LLAMACPP_MANIFEST)],
    ids=["vllm", "llamacpp"],
)
def test_manifest_runs_the_same_flags_as_the_script(script: Path, manifest: Path) -> None:
    args = container(manifest)["args"]
    assert {a for a in args if a.startswith("--")} == script_flags(script)


def test_vllm_image_matches_the_pinned_version() -> None:
    lines = (DEPLOY / "vllm" / "requirements.txt").read_text().splitlines()
    (pin,) = [line for line in lines if line.startswith("vllm==")]
    version = pin.split("==")[1].strip()
    assert container(VLLM_MANIFEST)["image"] == f"vllm/vllm-openai:v{version}"


def services() -> dict[tuple[str, int], str]:
    """(cluster DNS name, port) -> the manifest that exposes it."""
    exposed = {}
    for manifest in (VLLM_MANIFEST, LLAMACPP_MANIFEST):
        for service in objects_of(manifest, "Service"):
            meta = service["metadata"]
            host = f"{meta['name']}.{meta['namespace']}.svc.cluster.local"
            for port in service["spec"]["ports"]:
                exposed[(host, port["port"])] = manifest.name
    return exposed


def test_real_pools_policy_loads() -> None:
    policy = load_policy(REAL_POOLS, environ={"MOONSHOT_API_KEY": "test"})
    assert {"b300-vllm", "a100-llamacpp", "paid-api"} <= set(policy.backends)
    paid = policy.backends["paid-api"]
    assert paid.api_key == "test" and paid.token_prices is not None


@pytest.mark.parametrize(
    ("backend", "manifest", "model_flag"),
    [("b300-vllm", VLLM_MANIFEST, "--served-model-name"), ("a100-llamacpp", LLAMACPP_MANIFEST, "--alias")],
)
def test_real_pools_policy_points_at_what_the_recipes_expose(
    backend: str, manifest: Path, model_flag: str
) -> None:
    compiled = load_policy(REAL_POOLS, environ={}).backends[backend]
    exposed = services()
    signals = compiled.signals
    for url in (compiled.base_url, signals.metrics_url, signals.health_url, signals.slots_url):
        if url is None:
            continue
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None, url
        assert exposed.get((parts.hostname, parts.port)) == manifest.name, url
    assert urlsplit(compiled.base_url).path == "/v1"
    args = container(manifest)["args"]
    assert compiled.model == flag_value(args, model_flag)
    assert signals.metrics_url is not None and signals.metrics_url.endswith("/metrics")
    assert signals.health_url is not None and signals.health_url.endswith("/health")
    if compiled.dialect == "llamacpp":
        assert "--metrics" in args and "--slots" in args
        assert signals.slots_url is not None and signals.slots_url.endswith("/slots")
        assert compiled.max_concurrency == int(flag_value(args, "--parallel"))
    else:
        assert compiled.max_concurrency == int(flag_value(args, "--max-num-seqs"))


def test_the_sglang_recipe_enables_metrics_and_its_policy_checks() -> None:
    script = (DEPLOY / "sglang" / "serve-kimi-k3.sh").read_text()
    assert "--enable-metrics" in script and "--reasoning-parser" in script
    assert "--enable-cache-report" in script  # else cached tokens read 0 (docs/contracts/sglang.yaml)
    compiled = load_policy(DEPLOY / "sglang" / "policy.yaml", environ={})
    (backend,) = compiled.backends.values()
    assert backend.dialect == "sglang" and backend.signals.metrics_url is not None
    assert backend.signals.health_timeout_s > 1.2  # /health is a one-token generation
    port = re.search(r'PORT="\$\{PORT:-(\d+)\}"', script)
    assert port is not None and f":{port.group(1)}/" in backend.base_url + "/"
