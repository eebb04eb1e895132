"""The hostile-input row: schemathesis against a real ``gateway serve`` process, from the gateway's own
/openapi.json, over three emulator processes; then the hypothesis properties on the parsers.

Schemathesis runs as its own command (``schemathesis run``), a client like any other: it sends what the
description allows (positive) and what it forbids (negative), checks every answer against the
described statuses, media types and schemas, and writes a JSON report this row reads back. What counts
as a client-visible failure: a 5xx (the emulators are healthy, so no 502/503/504 is explained), any
check schemathesis reports, and any traceback in the gateway's log. Leaks: the gateway's open file
descriptors and sockets after the run, once the traffic has stopped, against before it; its PSS after
warm-up and at the end.

    python -m bench.reliability --only fuzz [--short]
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.procs import Proc
from bench.reliability.process import open_fds, open_sockets, pss_bytes, start_emulator, start_gateway
from bench.reliability.row import Row, Settings
from bench.servers import REPO

PAID_KEY = "fuzz-paid-backend-secret"
ADMIN_KEY = "gwk-fuzz-admin-key-not-a-secret"
USER_KEY = "gwk-fuzz-user-key-not-a-secret"
PROFILES = {"b300-vllm": "vllm", "a100-llamacpp": "llamacpp", "paid-api": "openai"}
# Checks that hold for this gateway. Left out: positive_data_acceptance (a well-formed request may still
# be refused for what the description cannot say, such as a budget or a prompt past the context window);
# negative_data_rejection (the doors check only the fields they read, the hot path's rule, and pass the
# rest to the backend, which judges them: the emulators are lenient where a real server refuses); and
# use_after_free / ensure_resource_availability (nothing here is created or deleted).
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
    "response_schema_conformance,missing_required_header,unsupported_method,ignored_auth"
)
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|Exception in ASGI application")
# Hostile input must not buy memory: PSS at the end within half again of after warm-up (caches such as the
# live stats' windows fill during the run; a body or a stream held on to would show as far more).
MEMORY_GROWTH_BOUND = 1.5
SETTLE_S = 2.0  # after the last request, time for connections to close before counting fds


@dataclass
class Stack:
    url: str
    gateway: Proc
    processes: list[Proc]
    log_dir: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def policy_text(ports: dict[str, int]) -> str:
    """Three backends and a few routes; keys, so that the auth checks have something to check."""
    from gateway.values.auth import digest_of

    def url(name: str) -> str:
        return f"http://127.0.0.1:{ports[name]}"

    return f"""
backends:
  b300-vllm:
    dialect: vllm
    url: {url("b300-vllm")}/v1
    model: moonshotai/Kimi-K3
    thinking: mandatory
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, accounting: marginal}}}}
    signals: {{metrics_url: {url("b300-vllm")}/metrics, health_url: {url("b300-vllm")}/health}}
    timeouts: {{first_byte_s: 10, idle_s: 5}}
  a100-llamacpp:
    dialect: llamacpp
    url: {url("a100-llamacpp")}/v1
    model: kimi-k3-ud-iq1_s
    thinking: mandatory
    max_concurrency: 4
    pricing: {{gpu_hours: {{usd_per_hour: 20.09}}}}
    signals:
      metrics_url: {url("a100-llamacpp")}/metrics
      slots_url: {url("a100-llamacpp")}/slots
      health_url: {url("a100-llamacpp")}/health
    timeouts: {{first_byte_s: 10, idle_s: 5}}
  paid-api:
    dialect: openai
    url: {url("paid-api")}/v1
    model: kimi-k3
    api_key_env: FUZZ_PAID_API_KEY
    thinking: mandatory
    pricing:
      per_token: {{input_usd_per_mtok: 0.6, cached_input_usd_per_mtok: 0.15, output_usd_per_mtok: 15}}
    timeouts: {{first_byte_s: 10, idle_s: 5}}
routes:
  kimi-k3:
    backends: [b300-vllm, paid-api, a100-llamacpp]
  llamacpp-only:
    backends: [a100-llamacpp]
auth:
  keys:
    - {{name: fuzz-admin, sha256: {digest_of(ADMIN_KEY)}, admin: true}}
    - {{name: fuzz-user, sha256: {digest_of(USER_KEY)}, routes: [kimi-k3]}}
"""


@contextlib.contextmanager
def fuzz_stack(log_dir: Path, time_scale: float = 0.01) -> Iterator[Stack]:
    """Three emulators and ``gateway serve`` as processes on free loopback ports; stopped by their ids."""
    log_dir.mkdir(parents=True, exist_ok=True)
    processes: list[Proc] = []
    try:
        ports = {name: free_port() for name in PROFILES}
        for name, port in ports.items():
            scale = ("--time-scale", str(time_scale))
            if name == "paid-api":
                os.environ["EMULATOR_API_KEY"] = PAID_KEY
            try:
                processes.append(start_emulator(name, name, port, log_dir, *scale))
            finally:
                os.environ.pop("EMULATOR_API_KEY", None)
        policy = log_dir / "fuzz-policy.yaml"
        policy.write_text(policy_text(ports))
        port = free_port()
        env = {"FUZZ_PAID_API_KEY": PAID_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        gateway = start_gateway("fuzz-gateway", policy, port, log_dir, env=env)
        processes.append(gateway)
        yield Stack(f"http://127.0.0.1:{port}", gateway, processes, log_dir)
    finally:
        for proc in reversed(processes):
            proc.stop()


def run_schemathesis(
    stack: Stack, *, max_examples: int, seed: int, max_time_s: int, report: Path, key: str = ADMIN_KEY
) -> dict[str, Any]:
    """``schemathesis run`` against the stack's /openapi.json; what its JSON report says."""
    argv = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{stack.url}/openapi.json",
        "--header", f"Authorization: Bearer {key}", "--checks", CHECKS, "--mode", "all",
        "--phases", "examples,coverage,fuzzing", "--max-examples", str(max_examples), "--seed", str(seed),
        "--max-time", str(max_time_s), "--request-timeout", "30", "--workers", "1",
        "--suppress-health-check", "all", "--no-color", "--continue-on-failure",
        "--report", "json", "--report-json-path", str(report),
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as cwd:  # its own cwd: no stray config file or report dir
        timeout = max_time_s + 120
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    (stack.log_dir / "schemathesis.log").write_text(done.stdout + done.stderr)
    if not report.exists():
        raise RuntimeError(f"schemathesis wrote no report (exit {done.returncode}):\n{done.stdout[-3000:]}")
    result: dict[str, Any] = json.loads(report.read_text())
    result["_exit"] = done.returncode
    result["_output"] = done.stdout[-6000:]
    return result


def tracebacks(log: Path) -> list[str]:
    text = log.read_text(errors="replace")
    return [text[m.start() : m.start() + 1500] for m in TRACEBACK.finditer(text)]


def run(settings: Settings) -> list[Row]:
    return [schemathesis_row(settings), properties_row(settings)]


def schemathesis_row(settings: Settings) -> Row:
    row = Row("fuzz: schemathesis on /openapi.json")
    out = settings.out_dir / "fuzz"
    settings.say("fuzz: starting three emulators and gateway serve")
    with fuzz_stack(out) as stack:
        pid = stack.gateway.pid
        warm_up(stack.url)
        row.memory_before_bytes = pss_bytes(pid)
        fds_before, sockets_before = open_fds(pid), open_sockets(pid)
        examples, max_time = (10, 30) if settings.short else (100, 240)
        settings.say(f"fuzz: schemathesis, up to {examples} examples per operation, at most {max_time} s")
        report = run_schemathesis(
            stack, max_examples=examples, seed=settings.seed, max_time_s=max_time, report=out / "report.json"
        )
        time.sleep(SETTLE_S)
        row.memory_after_bytes = pss_bytes(pid)
        fds_after, sockets_after = open_fds(pid), open_sockets(pid)
        found = tracebacks(stack.gateway.log_path)
        alive = stack.gateway.alive()
    summary = summarize(report)
    row.requests = summary["requests"]
    row.client_visible_failures = summary["failures"] + len(found)
    row.details = {
        **summary,
        "tracebacks": len(found),
        "fds": [fds_before, fds_after],
        "sockets": [sockets_before, sockets_after],
        "report": str(out / "report.json"),
    }
    if summary["failures"]:
        row.problems.append(f"schemathesis found {summary['failures']} failures: {summary['by_check']}")
    if summary["fuzzer_errors"]:  # a case not run is not a failure of the gateway: said, not counted
        settings.say(
            f"fuzz: schemathesis's own errors: {summary['fuzzer_errors']} (see {out}/schemathesis.log)"
        )
    if found:
        row.problems.append(f"{len(found)} tracebacks in the gateway's log; the first:\n{found[0]}")
    if not alive:
        row.problems.append("the gateway died during the run")
    if row.requests == 0:
        row.problems.append("schemathesis made no request")
    before, after = row.memory_before_bytes or 0, row.memory_after_bytes or 0
    if after > before * MEMORY_GROWTH_BOUND:
        row.problems.append(f"PSS grew from {before / 2**20:.0f} to {after / 2**20:.0f} MiB")
    # A few fds may be pooled upstream connections; growth past that is a leak.
    if fds_after > fds_before + 8:
        row.leaks.append(f"file descriptors {fds_before} -> {fds_after}")
    if sockets_after > sockets_before + 8:
        row.leaks.append(f"sockets {sockets_before} -> {sockets_after}")
    leaks = ", ".join(row.leaks) or "none"
    settings.say(f"fuzz: {row.requests} requests, {row.client_visible_failures} failures, leaks: {leaks}")
    return row


def warm_up(url: str) -> None:
    """A few real requests, so PSS before is measured with the request path's code loaded."""
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for stream in (False, True, False, True):
            client.post("/v1/chat/completions", json={**body, "stream": stream}).raise_for_status()
        client.get("/openapi.json").raise_for_status()


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Test cases and failures (by schemathesis's code and title) from its JSON report."""
    by_check = {f"{f['code']} {f['title']}": int(f["count"]) for f in report.get("failures", ())}
    # Errors: a "Runtime Error" is schemathesis's own, in generating a case (CPython 3.11's ast.parse,
    # which hypothesis calls to describe a strategy, now and then fails with "AST constructor recursion
    # depth mismatch": python/cpython#106905); any other (a network error, a timeout) is the gateway's.
    errors = {str(e.get("title")): int(e.get("count", 1)) for e in report.get("errors", ())}
    fuzzer_errors = errors.pop("Runtime Error", 0)
    return {
        "requests": int(report.get("test_cases", {}).get("generated", 0)),
        "failures": sum(by_check.values()) + sum(errors.values()),
        "by_check": {**by_check, **errors},
        "fuzzer_errors": fuzzer_errors,
        "operations_tested": report.get("operations", {}).get("tested", 0),
        "operations_total": report.get("operations", {}).get("total", 0),
    }


def properties_row(settings: Settings) -> Row:
    """tests/unit/test_properties.py under pytest, with hypothesis's example count scaled to the run."""
    row = Row("fuzz: hypothesis properties (SSE, requests, policies)")
    examples = "100" if settings.short else "2000"
    settings.say(f"fuzz: hypothesis properties, {examples} examples each")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics"]
    argv.append("tests/unit/test_properties.py")
    env = {**os.environ, "GATEWAY_PROPERTY_EXAMPLES": examples, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    (settings.out_dir / "fuzz").mkdir(parents=True, exist_ok=True)
    (settings.out_dir / "fuzz" / "properties.log").write_text(done.stdout + done.stderr)
    passed = _count(done.stdout, "passed")
    failed = _count(done.stdout, "failed") + _count(done.stdout, "error")
    # Inputs tried: hypothesis's statistics per phase, plus one for each plain (parametrized) test.
    tried = [int(a) + int(b) for a, b in re.findall(r"(\d+) passing, (\d+) failing", done.stdout)]
    hypothesis_tests = len(re.findall(r"^tests/unit/test_properties.py::\S+:$", done.stdout, re.MULTILINE))
    row.requests = sum(tried) + max(0, passed + failed - hypothesis_tests)
    row.client_visible_failures = failed
    row.details = {"tests_passed": passed, "tests_failed": failed, "examples_each": int(examples)}
    if done.returncode != 0:
        row.problems.append(f"property tests failed:\n{done.stdout[-2000:]}")
    settings.say(f"fuzz: properties {passed} passed, {failed} failed")
    return row


def _count(output: str, word: str) -> int:
    match = re.search(rf"(\d+) {word}", output)
    return int(match.group(1)) if match else 0
