"""The gateway's own deployment holds together offline: the image (deploy/gateway/Dockerfile), the compose
stack (deploy/compose, policies/compose.yaml) and the Kubernetes manifests (deploy/kubernetes) agree with
each other and with what the gateway really serves. No container engine or cluster is needed; the
compose stack's commands and policy are also run for real, as loopback processes in this test."""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx
import kubernetes_validate
import pytest
import yaml
from starlette.routing import Mount, Route

from gateway.api import admin, dashboard
from gateway.app import create_app
from gateway.cli import build_parser
from gateway.commands import cmd_emulate, cmd_serve
from gateway.emulator import PROFILES, create_emulator_app
from gateway.policy.load import load_policy
from gateway.policy.reload import PolicyHolder
from gateway.runtime import Runtime
from gateway.runtime.stopping import STOP_MARGIN_S
from tests.conftest import Gateway
from tests.servers import free_port, threaded_server

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "gateway" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
COMPOSE_POLICY = ROOT / "policies" / "compose.yaml"
K8S = ROOT / "deploy" / "kubernetes"
KUSTOMIZATION = K8S / "Kustomization"
REAL_POOLS = ROOT / "policies" / "real-pools.yaml"
KUBERNETES_VERSION = "1.33"  # the schemas bundled in kubernetes-validate: offline
NAMESPACE = "llm-gateway"
SERVE_ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MOONSHOT_API_KEY": ""}
TIME_SCALE = 0.02  # the emulators of the end-to-end check run fifty times faster than the published figures
ENDPOINTS = {r.path for r in (*admin.routes, *dashboard.routes) if isinstance(r, Route | Mount)}

# The compose stack emulates the three Kimi K3 tiers (the other profiles, Anthropic and SGLang, are
# for tests of those dialects).
KIMI_PROFILES = {"b300-vllm", "a100-llamacpp", "paid-api"}


# --- deploy/gateway/Dockerfile --------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: int  # 0 for the first FROM's stage, 1 for the next, ...

    def exec_form(self) -> list[str]:
        words = json.loads(self.args)
        assert isinstance(words, list), f"{self.keyword} is not in exec form: {self.args}"
        return words


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comment lines dropped (inside a continuation too,
    as Docker does). Enough of the syntax for the checks below, not a general parser."""
    instructions: list[Instruction] = []
    stage, pending = -1, ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        pending = ""
        if keyword.upper() == "FROM":
            stage += 1
        instructions.append(Instruction(keyword.upper(), args.strip(), stage))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def only(instructions: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in instructions if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def image_env(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in final_stage(instructions):
        if instruction.keyword == "ENV":
            for word in shlex.split(instruction.args):
                name, _, value = word.partition("=")
                env[name] = value
    return env


def image_user(instructions: list[Instruction]) -> tuple[int, int]:
    uid, _, gid = only(final_stage(instructions), "USER").args.partition(":")
    return int(uid), int(gid or uid)


def copies(instructions: list[Instruction]) -> list[tuple[list[str], str, str | None]]:
    """(sources, destination, --from stage or None) of every COPY."""
    found = []
    for instruction in instructions:
        if instruction.keyword != "COPY":
            continue
        words = shlex.split(instruction.args)
        flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--"))
        paths = [w for w in words if not w.startswith("--")]
        found.append((paths[:-1], paths[-1], flags.get("from")))
    return found


def parse_cli(args: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"`gateway {' '.join(args)}` does not parse")


def dockerignore_excludes(path: str) -> bool:
    """Docker's rules: patterns in order, the last one matching the path or a parent of it wins."""
    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and p[0] != "#"]
    candidates = [path, *(str(parent) for parent in PurePosixPath(path).parents if str(parent) != ".")]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatchcase(candidate, pattern) for candidate in candidates):
            excluded = not negated
    return excluded


def test_image_builds_a_wheel_then_runs_its_venv_from_a_second_slim_stage(
    dockerfile: list[Instruction],
) -> None:
    args = {i.args.split("=")[0]: i.args.split("=", 1)[1] for i in dockerfile if i.keyword == "ARG"}
    froms = [i.args for i in dockerfile if i.keyword == "FROM"]
    assert len(froms) == 2
    build_base, build_name = froms[0].split(" AS ")
    bases = [build_base, froms[1]]
    assert all(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], b) == "python:3.11-slim" for b in bases)
    build_steps = " ".join(i.args for i in dockerfile if i.stage == 0 and i.keyword == "RUN")
    assert "pip wheel" in build_steps and "python -m venv /opt/gateway" in build_steps
    assert (["/opt/gateway"], "/opt/gateway", build_name) in copies(dockerfile)
    assert image_env(dockerfile)["PATH"].startswith("/opt/gateway/bin:")


def test_image_runs_as_a_fixed_non_root_user(dockerfile: list[Instruction]) -> None:
    uid, gid = image_user(dockerfile)
    assert uid != 0 and gid != 0
    setup = " ".join(i.args for i in final_stage(dockerfile) if i.keyword == "RUN")
    assert f"--uid {uid}" in setup and f"--gid {gid}" in setup
    workdir = only(final_stage(dockerfile), "WORKDIR").args
    assert f"chown {uid}:{gid} {workdir}" in setup, "the ledger's directory is writable by the user"


def test_image_environment_keeps_litellm_offline_and_logs_unbuffered(dockerfile: list[Instruction]) -> None:
    env = image_env(dockerfile)
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_image_serves_the_bundled_policy_on_the_exposed_port(dockerfile: list[Instruction]) -> None:
    stage = final_stage(dockerfile)
    assert only(stage, "ENTRYPOINT").exec_form() == ["gateway"]
    args = parse_cli(only(stage, "CMD").exec_form())
    assert args.func is cmd_serve and args.host == "0.0.0.0"
    assert only(stage, "EXPOSE").args == str(args.port) == "8080"
    (sources,) = [src for src, dest, _ in copies(stage) if dest == args.policy]
    assert sources == ["policies/default.yaml"]
    load_policy(ROOT / sources[0], environ={})


def test_every_copied_path_is_in_the_repository_and_the_build_context(dockerfile: list[Instruction]) -> None:
    sources = [s for src, _, stage in copies(dockerfile) if stage is None for s in src]
    # pyproject.toml names README.md as the readme: the wheel build reads it.
    assert {"pyproject.toml", "README.md", "gateway", "policies/default.yaml"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignore_excludes(source), f".dockerignore keeps {source} out of the context"
    for kept_out in (".venv", ".git", "var/ledger.sqlite3", "tests/conftest.py", "gateway/__pycache__"):
        assert dockerignore_excludes(kept_out), kept_out


def healthcheck(dockerfile: list[Instruction]) -> tuple[list[str], str]:
    """The HEALTHCHECK's exec-form command and the URL it asks by default."""
    args = only(final_stage(dockerfile), "HEALTHCHECK").args
    options, _, command = args.partition("CMD ")
    assert "--timeout=" in options and "--interval=" in options
    return json.loads(command), image_env(dockerfile)["GATEWAY_HEALTHCHECK_URL"]


def test_healthcheck_asks_the_gateways_health_endpoint(dockerfile: list[Instruction]) -> None:
    command, url = healthcheck(dockerfile)
    assert command[:2] == ["python", "-c"], "no curl in a slim image: the venv's python asks"
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and str(parts.port) == only(dockerfile, "EXPOSE").args
    assert parts.path == "/health" and parts.path in ENDPOINTS


# --- deploy/compose ---------------------------------------------------------------------------------------


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default}, taking the default: the stack must come up with nothing set."""

    def default(match: re.Match[str]) -> str:
        assert match.group(2) is not None, f"${{{match.group(1)}}} has no default"
        return match.group(2)

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", default, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def command(service: dict[str, Any]) -> list[str]:
    return [interpolate(str(word)) for word in service.get("command", [])]


def environment(service: dict[str, Any]) -> dict[str, str]:
    return {k: interpolate(str(v)) for k, v in service.get("environment", {}).items()}


def of_command(compose: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """The services running `gateway NAME` (serve, emulate) from the gateway image."""
    return {n: s for n, s in services(compose).items() if "build" in s and command(s)[:1] == [name]}


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of the service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (COMPOSE_DIR / source).resolve()
        else:
            assert "/" not in source, volume
    return mounts


def host_path(service: dict[str, Any], container_path: str) -> Path:
    for target, source in sorted(bind_mounts(service).items(), key=lambda m: -len(m[0])):
        if container_path == target or container_path.startswith(target + "/"):
            return source / os.path.relpath(container_path, target)
    raise AssertionError(f"{container_path} is not mounted from the repository")


def compose_policy_env(compose: dict[str, Any]) -> dict[str, str]:
    (gateway, *_) = of_command(compose, "serve").values()
    return environment(gateway)


def test_compose_runs_two_gateways_redis_monitoring_and_the_three_emulated_backends(
    compose: dict[str, Any],
) -> None:
    assert len(of_command(compose, "serve")) == 2
    profiles = {parse_cli(command(s)).profile for s in of_command(compose, "emulate").values()}
    assert profiles == KIMI_PROFILES
    assert {"redis", "prometheus", "grafana"} <= set(services(compose))


def test_every_service_has_the_gateway_build_or_a_pinned_image(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image ({image})"
        if "build" in service:
            context = (COMPOSE_DIR / service["build"]["context"]).resolve()
            assert context == ROOT and context / service["build"]["dockerfile"] == DOCKERFILE, name


def test_every_gateway_command_parses_and_publishes_only_on_loopback(compose: dict[str, Any]) -> None:
    policy = load_policy(COMPOSE_POLICY, environ=compose_policy_env(compose))
    for name, service in of_command(compose, "serve").items():
        args = parse_cli(command(service))
        assert args.func is cmd_serve and args.host == "0.0.0.0", name
        assert args.open == (not policy.api_keys), f"{name}: --open exactly when the policy has no keys"
        for mapping in service["ports"]:
            host_ip, _, container_port = mapping.rpartition(":")
            assert int(container_port) == args.port, name
            if args.open:
                assert host_ip.startswith("127.0.0.1:"), f"{name}: an open gateway is published on loopback"


def test_every_emulator_listens_where_its_healthcheck_asks(compose: dict[str, Any]) -> None:
    for name, service in of_command(compose, "emulate").items():
        args = parse_cli(command(service))
        assert args.func is cmd_emulate and args.host == "0.0.0.0", name
        assert urlsplit(environment(service)["GATEWAY_HEALTHCHECK_URL"]).port == args.port, name
        check = service["healthcheck"]["test"]
        assert check[:3] == ["CMD", "python", "-c"] and "GATEWAY_HEALTHCHECK_URL" in check[3], name


def test_dependencies_exist_and_wait_only_on_services_with_health_checks(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        depends = service.get("depends_on", {})
        conditions = depends if isinstance(depends, dict) else {key: {} for key in depends}
        for target, how in conditions.items():
            assert target in services(compose), f"{name} depends on unknown {target}"
            if how.get("condition") == "service_healthy":
                assert "healthcheck" in services(compose)[target] or "build" in services(compose)[target]


def test_every_mounted_file_exists_and_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in services(compose).items():
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name} mounts {source} at {target}, which does not exist"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name}: named volume {source} is not declared"


def test_the_gateways_mount_the_compose_policy_as_a_directory(compose: dict[str, Any]) -> None:
    for name, service in of_command(compose, "serve").items():
        policy = parse_cli(command(service)).policy
        assert host_path(service, policy) == COMPOSE_POLICY, name
        assert policy not in bind_mounts(service), f"{name}: a single-file mount misses renamed edits"


def test_the_compose_policy_points_at_the_emulator_services(compose: dict[str, Any]) -> None:
    emulators = {n: parse_cli(command(s)) for n, s in of_command(compose, "emulate").items()}
    paid_key = environment(services(compose)["paid-api"])["EMULATOR_API_KEY"]
    policy = load_policy(COMPOSE_POLICY, environ=compose_policy_env(compose))
    assert policy.backends["paid-api"].api_key == paid_key, "the gateways send the emulated vendor's key"
    for name, backend in policy.backends.items():
        signals = backend.signals
        for url in (backend.base_url, signals.metrics_url, signals.health_url, signals.slots_url):
            if url is None:
                continue
            parts = urlsplit(url)
            assert parts.hostname in emulators, f"{name}: {url} names no emulator service"
            assert parts.port == emulators[parts.hostname].port, url
            assert PROFILES[emulators[parts.hostname].profile].dialect == backend.dialect, url


def test_the_gateways_share_the_redis_service_and_one_environment(compose: dict[str, Any]) -> None:
    gateways = of_command(compose, "serve")
    assert all(environment(s) == compose_policy_env(compose) for s in gateways.values())
    for name, service in gateways.items():
        parts = urlsplit(environment(service)["GATEWAY_REDIS_URL"])
        assert parts.scheme == "redis" and parts.port == 6379, name
        assert services(compose)[parts.hostname or ""]["image"].startswith("redis:"), name
        assert "redis" in service["depends_on"], name
        multiproc = environment(service)["PROMETHEUS_MULTIPROC_DIR"]
        assert multiproc in service["tmpfs"], f"{name}: the multiprocess metrics directory is a tmpfs"


def prometheus_files(compose: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository file of what the prometheus service mounts."""
    return bind_mounts(services(compose)["prometheus"])


def test_prometheus_scrapes_every_gateway_replica_and_loads_the_alert_rules(compose: dict[str, Any]) -> None:
    mounted = prometheus_files(compose)
    config_path = mounted["/etc/prometheus/prometheus.yml"]
    assert config_path == COMPOSE_DIR / "prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "llm-gateway"]
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    gateways = of_command(compose, "serve")
    assert targets == {f"{n}:{parse_cli(command(s)).port}" for n, s in gateways.items()}
    assert job["metrics_path"] in ENDPOINTS
    for rules in config["rule_files"]:
        assert f"/etc/prometheus/{rules}" in mounted, f"{rules} is not mounted beside the config"


def test_promtool_accepts_the_compose_prometheus_config(compose: dict[str, Any], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    for target, source in prometheus_files(compose).items():
        if target.startswith("/etc/prometheus/") and source.is_file():
            shutil.copy(source, tmp_path / PurePosixPath(target).name)
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_is_provisioned_with_prometheus_and_the_gateway_dashboard(compose: dict[str, Any]) -> None:
    grafana = services(compose)["grafana"]
    provisioning = host_path(grafana, "/etc/grafana/provisioning")
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    parts = urlsplit(datasource["url"])
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    assert parts.hostname == "prometheus" and parts.port == 9090
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "gateway.yaml").read_text())["providers"]
    folder = provider["options"]["path"]
    dashboards = [host_path(grafana, t) for t in bind_mounts(grafana) if t.startswith(folder + "/")]
    assert dashboards == [ROOT / "deploy" / "grafana" / "gateway-dashboard.json"]
    assert json.loads(dashboards[0].read_text())["uid"]
    home = environment(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert host_path(grafana, home) == dashboards[0]


def test_docker_compose_accepts_the_file() -> None:
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode:
        pytest.skip("the docker compose CLI plugin is not installed")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


# The compose stack run for real: each emulator as its compose command describes it (on a free loopback
# port instead of its service name) and a gateway on policies/compose.yaml with the service names
# rewritten to those ports, the credentials coming from the compose file's environment. Only those:
# the rest of that environment (Redis, the metrics directory) names things that exist inside compose.


def emulator_app(profile: str, env: dict[str, str]) -> Any:
    """The emulator reads its API key from the environment once, when the app is created."""
    with pytest.MonkeyPatch.context() as patch:
        if "EMULATOR_API_KEY" in env:
            patch.setenv("EMULATOR_API_KEY", env["EMULATOR_API_KEY"])
        else:
            patch.delenv("EMULATOR_API_KEY", raising=False)
        return create_emulator_app(profile, time_scale=TIME_SCALE)


@pytest.fixture(scope="module")
def compose_stack(compose: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    text = COMPOSE_POLICY.read_text()
    folder = tmp_path_factory.mktemp("compose")
    with contextlib.ExitStack() as stack:
        for name, service in of_command(compose, "emulate").items():
            args = parse_cli(command(service))
            server = stack.enter_context(threaded_server(emulator_app(args.profile, environment(service))))
            text = text.replace(f"http://{name}:{args.port}", server.url)
        (folder / "policy.yaml").write_text(text)
        holder = PolicyHolder(folder / "policy.yaml", environ=compose_policy_env(compose))
        app = create_app(lambda: Runtime(holder, ledger_path=folder / "ledger.sqlite3"))
        yield Gateway(stack.enter_context(threaded_server(app)), folder / "policy.yaml")


def test_the_compose_gateway_is_ready_with_every_backend_reachable(compose_stack: Gateway) -> None:
    report = httpx.get(compose_stack.url + "/ready", timeout=10).json()
    assert report["ready"] is True
    # The paid-api emulator answers only with the key the gateway got from the compose environment.
    assert report["backends"] == {name: "ok" for name in KIMI_PROFILES}


@pytest.mark.parametrize("route", ["kimi-k3", "kimi-k3-batch", "kimi-k3-fast"])
def test_every_route_of_the_compose_policy_answers(compose_stack: Gateway, route: str) -> None:
    body = {"model": route, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}
    response = httpx.post(compose_stack.base_url + "/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-backend"] in compose_stack.runtime.policy.routes[route].backends


def test_the_image_healthcheck_passes_on_health_and_fails_otherwise(
    dockerfile: list[Instruction], compose_stack: Gateway
) -> None:
    command, _ = healthcheck(dockerfile)

    def run_healthcheck(url: str) -> int:
        env = {**os.environ, "GATEWAY_HEALTHCHECK_URL": url}
        return subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True).returncode

    assert run_healthcheck(compose_stack.url + "/health") == 0
    assert run_healthcheck(compose_stack.url + "/no-such-endpoint") != 0
    assert run_healthcheck(f"http://127.0.0.1:{free_port()}/health") != 0


# --- deploy/kubernetes ------------------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(K8S.glob("*.yaml"))


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in yaml.safe_load_all(path.read_text()) if doc]


def objects(k8s: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in k8s if o["kind"] == kind]


def named(k8s: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects(k8s, kind) if o["metadata"]["name"] == name]
    return found


def gateway_deployment(k8s: list[dict[str, Any]]) -> dict[str, Any]:
    return named(k8s, "Deployment", "llm-gateway")


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def main_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(deployment)["containers"]
    result: dict[str, Any] = container
    return result


def container_env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def mounted_volume(deployment: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volumeMount at exactly ``path`` and the volume it mounts."""
    (mount,) = [m for m in main_container(deployment)["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"]]
    return mount, volume


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_every_manifest_validates_against_the_kubernetes_schemas(path: Path) -> None:
    for obj in yaml.safe_load_all(path.read_text()):
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name}: {obj['kind']}: {'.'.join(map(str, exc.path))}: {exc.message}")


def test_the_kustomization_applies_every_manifest_but_the_secret_template(k8s: list[dict[str, Any]]) -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert kustomization["kind"] == "Kustomization"
    expected = [p.name for p in manifest_files() if not p.name.endswith(".example.yaml")]
    assert sorted(kustomization["resources"]) == expected
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        rendered = subprocess.run(
            [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, check=True
        )
        kinds = [doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc]
        assert len(kinds) == len(k8s) - len(objects(k8s, "Secret"))


def test_everything_lives_in_the_gateway_namespace(k8s: list[dict[str, Any]]) -> None:
    assert [o["metadata"]["name"] for o in objects(k8s, "Namespace")] == [NAMESPACE]
    for obj in k8s:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"


def serve_args(deployment: dict[str, Any]) -> argparse.Namespace:
    container = main_container(deployment)
    args = parse_cli([*container.get("command", []), *container["args"]])
    assert args.func is cmd_serve
    return args


def test_the_configmap_holds_the_real_pools_policy_byte_for_byte(k8s: list[dict[str, Any]]) -> None:
    args = serve_args(gateway_deployment(k8s))
    _, volume = mounted_volume(gateway_deployment(k8s), str(PurePosixPath(args.policy).parent))
    data = named(k8s, "ConfigMap", volume["configMap"]["name"])["data"]
    assert data[PurePosixPath(args.policy).name] == REAL_POOLS.read_text()


def test_the_policy_is_mounted_as_a_directory_so_updates_reach_it(k8s: list[dict[str, Any]]) -> None:
    deployment = gateway_deployment(k8s)
    policy = PurePosixPath(serve_args(deployment).policy)
    mount, volume = mounted_volume(deployment, str(policy.parent))
    assert "subPath" not in mount and "subPathExpr" not in mount, "subPath mounts never see an update"
    assert mount.get("readOnly") is True and "items" not in volume["configMap"]


def test_the_gateway_listens_on_the_pod_network_only_behind_a_network_policy(
    k8s: list[dict[str, Any]],
) -> None:
    deployment = gateway_deployment(k8s)
    args = serve_args(deployment)
    ports = {p["name"]: p["containerPort"] for p in main_container(deployment)["ports"]}
    assert args.host == "0.0.0.0" and ports["http"] == args.port
    assert not args.open, "the Deployment must not serve without client keys"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    guards = [
        n
        for n in objects(k8s, "NetworkPolicy")
        if selects(n["spec"]["podSelector"]["matchLabels"], pod_labels)
    ]
    assert guards and all(guard["spec"]["policyTypes"] == ["Ingress"] for guard in guards)
    redis = named(k8s, "Deployment", "redis")
    assert redis["spec"]["replicas"] == 1 and main_container(redis)["image"].startswith("redis:")


def test_paid_backend_keys_come_from_the_secret_template(k8s: list[dict[str, Any]]) -> None:
    secret = named(k8s, "Secret", "gateway-backend-keys")
    assert all(value == "" for value in secret["stringData"].values()), "the template holds no secret"
    env = container_env(main_container(gateway_deployment(k8s)))
    backends = yaml.safe_load(REAL_POOLS.read_text())["backends"].values()
    wanted = {b["api_key_env"] for b in backends if "api_key_env" in b}
    assert wanted and wanted == set(secret["stringData"])
    for name in wanted:
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (secret["metadata"]["name"], name)


def test_client_keys_come_from_a_secret_the_policy_reads(k8s: list[dict[str, Any]], tmp_path: Path) -> None:
    deployment = gateway_deployment(k8s)
    keys_file = PurePosixPath(yaml.safe_load(REAL_POOLS.read_text())["auth"]["keys_file"])
    mount, volume = mounted_volume(deployment, str(keys_file.parent))
    assert "subPath" not in mount and mount.get("readOnly") is True, "a rotated Secret must reach the pod"
    secret = named(k8s, "Secret", volume["secret"]["secretName"])
    assert volume["secret"].get("optional") is not True, "no Secret, no pod: never an open gateway"
    template = secret["stringData"][keys_file.name]
    # The template's file is what auth.keys_file reads: a policy pointing at a copy of it loads.
    (tmp_path / "keys.yaml").write_text(
        template.replace("keys: []", "keys:\n  - {name: app, sha256: " + "a" * 64 + "}")
    )
    policy_text = REAL_POOLS.read_text().replace(str(keys_file), str(tmp_path / "keys.yaml"))
    (tmp_path / "policy.yaml").write_text(policy_text)
    assert [k.name for k in load_policy(tmp_path / "policy.yaml", environ={}).api_keys.values()] == ["app"]


def test_the_deployments_command_refuses_to_serve_without_its_keys_secret(k8s: list[dict[str, Any]]) -> None:
    """Outside the pod the keys file is absent: the Deployment's own command line must then not start."""
    container = main_container(gateway_deployment(k8s))
    args = [a.replace("/etc/gateway/policy.yaml", str(REAL_POOLS)) for a in container["args"]]
    args[args.index("--port") + 1] = "0"
    done = subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=120, env=SERVE_ENV
    )
    assert done.returncode == 2, done.stderr
    assert "refusing to listen on 0.0.0.0 with no API keys" in done.stderr


def test_the_grace_period_ends_streams_before_the_kubelet_kills_the_pod(k8s: list[dict[str, Any]]) -> None:
    deployment = gateway_deployment(k8s)
    pre_stop = main_container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    budget = pod_spec(deployment)["terminationGracePeriodSeconds"] - float(pre_stop[1])
    # The drain's grace, then the stop's bounded rest (gateway.runtime.stopping: the error events, connections
    # that do not close, the runtime's close), all before SIGKILL.
    assert 0 < serve_args(deployment).grace_s + STOP_MARGIN_S <= budget
