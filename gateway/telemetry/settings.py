"""Where traces go and which are kept: the policy's ``telemetry`` section, the standard ``OTEL_*``
environment variables filling in what it leaves out (as every OpenTelemetry SDK reads them)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from gateway.policy.telemetry import Telemetry
from gateway.telemetry.context import Sampler

log = logging.getLogger("gateway")
TRACES_PATH = "/v1/traces"


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    endpoint: str  # the full OTLP/HTTP traces URL
    headers: tuple[tuple[str, str], ...]  # OTEL_EXPORTER_OTLP_(TRACES_)HEADERS: a hosted receiver's key
    sampler: Sampler
    service_name: str
    content: bool
    max_queued_traces: int
    batch_traces: int
    flush_interval_s: float
    export_timeout_s: float


def telemetry_settings(policy: Telemetry, environ: Mapping[str, str]) -> TelemetrySettings | None:
    """None (tracing off) unless an endpoint is named, or when OTEL_SDK_DISABLED=true."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    endpoint = traces_url(policy.otlp_endpoint, environ)
    if endpoint is None:
        return None
    headers = environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or environ.get(
        "OTEL_EXPORTER_OTLP_HEADERS", ""
    )
    return TelemetrySettings(
        endpoint=endpoint,
        headers=parsed_headers(headers),
        sampler=sampler_of(policy.sample_ratio, environ),
        service_name=policy.service_name or environ.get("OTEL_SERVICE_NAME") or "llm-gateway",
        content=policy.content,
        max_queued_traces=policy.max_queued_traces,
        batch_traces=policy.batch_traces,
        flush_interval_s=policy.flush_interval_s,
        export_timeout_s=policy.export_timeout_s,
    )


def traces_url(configured: str | None, environ: Mapping[str, str]) -> str | None:
    """The policy's endpoint, else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as it is), else
    OTEL_EXPORTER_OTLP_ENDPOINT (a base URL: ``/v1/traces`` is added, as the specification says)."""
    if configured:
        base = configured.rstrip("/")
        return base if base.endswith(TRACES_PATH) else base + TRACES_PATH
    signal = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if signal:
        return signal
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip().rstrip("/")
    return base + TRACES_PATH if base else None


def sampler_of(ratio: float | None, environ: Mapping[str, str]) -> Sampler:
    if ratio is not None:
        return Sampler(ratio, parent_based=True)
    name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    argument = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    parent_based = name.startswith("parentbased_")
    kind = name.removeprefix("parentbased_")
    if kind == "always_on":
        return Sampler(1.0, parent_based)
    if kind == "always_off":
        return Sampler(0.0, parent_based)
    if kind == "traceidratio":
        try:
            value = float(argument) if argument else 1.0
        except ValueError:
            value = 1.0
        return Sampler(min(max(value, 0.0), 1.0), parent_based)
    log.warning("OTEL_TRACES_SAMPLER=%s is not one the gateway knows; keeping every trace", name)
    return Sampler(1.0, True)


def parsed_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``key1=value1,key2=value2`` (values URL-encoded), as OTEL_EXPORTER_OTLP_HEADERS is written."""
    pairs = []
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name.strip() and value.strip():
            pairs.append((name.strip().lower(), unquote(value.strip())))
    return tuple(pairs)
