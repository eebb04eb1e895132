"""The servers under test and how each starts: the bench upstream, our gateway, and LiteLLM's proxy
(installed on first use into its own virtualenv, version pinned, no database, one worker)."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.procs import Proc, start

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
POLICY = BENCH / "policy.yaml"
POLICY_UPSTREAM = "127.0.0.1:18001"
VENV_LITELLM = BENCH / ".venv-litellm"
LITELLM_VERSION = "1.110.2"
# Where the index lacks the ``litellm-proxy`` wheel that ``litellm[proxy]`` names, its proxy still ships
# inside ``litellm``: these are the rest of the ``proxy`` extra's requirements for that version.
LITELLM_PROXY_DEPS = [
    "gunicorn>=23.0.0,<24.0", "uvicorn>=0.33.0,<1.0", "uvloop>=0.22.1,<1.0", "fastapi>=0.136.3,<1.0",
    "starlette>=1.0.1,<2.0", "backoff>=2.2.1,<3.0", "pyyaml>=6.0.3,<7.0", "rq>=2.7.0,<3.0",
    "orjson>=3.11.6,<4.0", "hiredis>=3.0.0,<4.0", "apscheduler>=3.11.2,<4.0", "fastapi-sso>=0.19.0,<1.0",
    "pyjwt>=2.13.0,<3.0", "python-multipart>=0.0.27,<1.0", "cryptography>=49.0.0,<51.0",
    "pynacl>=1.6.2,<2.0", "websockets>=15.0.1,<16.0", "rich>=13.9.4,<14.0", "semver>=3.0.4,<4",
    "backports-zstd>=1.0.0,<2.0", "expression>=5.6.0,<6.0", "tomlkit>=0.13.3,<1.0", "mcp>=2.3.0,<3",
    "httpx2>=2.10.0,<3", "litellm-proxy-extras", "litellm-enterprise", "restrictedpython>=8.5,<9.0",
    "inquirerpy>=0.3.4,<1.0", "boto3", "azure-identity", "azure-storage-blob", "polars", "soundfile",
    "granian",
]  # fmt: skip
# One key for every server: LiteLLM refuses to start without a master key; the others ignore it.
API_KEY = "sk-bench-" + secrets.token_hex(24)


def start_upstream(port: int, log_dir: Path) -> Proc:
    argv = [sys.executable, "-m", "bench.upstream", "--port", str(port)]
    return start("upstream", argv, cpus="1", log_dir=log_dir, env={"PYTHONPATH": str(REPO)})


def start_passthrough(port: int, upstream_port: int, log_dir: Path) -> Proc:
    """The bare Starlette + aiohttp pass-through (bench/passthrough.py): the in-Python limit."""
    argv = [sys.executable, "-m", "bench.passthrough", "--port", str(port)]
    argv += ["--upstream", f"http://127.0.0.1:{upstream_port}"]
    return start("bare", argv, cpus="0", log_dir=log_dir, env={"PYTHONPATH": str(REPO)})


def gateway_policy(upstream_port: int, out_dir: Path) -> Path:
    """bench/policy.yaml as it is, or a copy pointing at another upstream port."""
    if f"127.0.0.1:{upstream_port}" == POLICY_UPSTREAM:
        return POLICY
    rendered = out_dir / "policy.yaml"
    rendered.write_text(POLICY.read_text().replace(POLICY_UPSTREAM, f"127.0.0.1:{upstream_port}"))
    return rendered


def start_gateway(port: int, upstream_port: int, log_dir: Path) -> Proc:
    """Its spend ledger goes to a fresh file beside the results, never into the repo's var/ ledger."""
    gateway = Path(sys.executable).parent / "gateway"
    policy = gateway_policy(upstream_port, log_dir)
    ledger = log_dir / "ledger.sqlite3"
    for stale in log_dir.glob("ledger.sqlite3*"):
        stale.unlink()
    argv = [str(gateway), "serve", "--policy", str(policy), "--port", str(port), "--ledger", str(ledger)]
    return start("ours", argv, cpus="0", log_dir=log_dir)


def litellm_config(upstream_port: int) -> str:
    entries = []
    for route, model in (("bench-fast", "fast"), ("bench-paced", "paced")):
        entries.append(
            f"  - model_name: {route}\n    litellm_params:\n      model: openai/{model}\n"
            f"      api_base: http://127.0.0.1:{upstream_port}/v1\n      api_key: sk-upstream\n"
        )
    return "model_list:\n" + "".join(entries)


def ensure_litellm(say: Callable[[str], None]) -> Path | None:
    """The proxy's executable, installing it first if needed; None when it cannot be installed."""
    exe = VENV_LITELLM / "bin" / "litellm"
    marker = VENV_LITELLM / "bench-installed.txt"
    if exe.exists() and marker.exists() and marker.read_text().strip() == LITELLM_VERSION:
        return exe
    say(f"installing litellm[proxy]=={LITELLM_VERSION} into {VENV_LITELLM} (once; a minute or two)")
    if not (VENV_LITELLM / "bin" / "pip").exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(VENV_LITELLM)], check=True)
    pip = [str(VENV_LITELLM / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, f"litellm[proxy]=={LITELLM_VERSION}"], capture_output=True)
    if done.returncode != 0:
        say("litellm[proxy] does not resolve here (no litellm-proxy wheel); installing its requirements")
        done = subprocess.run([*pip, f"litellm=={LITELLM_VERSION}", *LITELLM_PROXY_DEPS], capture_output=True)
    if done.returncode != 0 or not exe.exists():
        say("LiteLLM install failed: " + done.stderr.decode(errors="replace")[-600:])
        return None
    marker.write_text(LITELLM_VERSION + "\n")
    return exe


def start_litellm(exe: Path, port: int, upstream_port: int, log_dir: Path) -> Proc:
    config = log_dir / "litellm-config.yaml"
    config.write_text(litellm_config(upstream_port))
    argv = [
        str(exe),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": API_KEY}
    return start("litellm", argv, cpus="0", log_dir=log_dir, env=env)
