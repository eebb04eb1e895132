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
        max_queued_traces=int(_batching(policy, "max_queued_traces", environ)),
        batch_traces=int(_batching(policy, "batch_traces", environ)),
        flush_interval_s=_batching(policy, "flush_interval_s", environ),
        export_timeout_s=_batching(policy, "export_timeout_s", environ),
    )


# The batch span processor's and the OTLP exporter's standard variables, for what the policy leaves
# unset: by field, the variables in the order they are read, and the factor from their unit (the
# specification's: milliseconds; counts of spans, read here as counts of traces, which the gateway
# queues and batches whole).
BATCHING_VARIABLES: dict[str, tuple[tuple[str, ...], float]] = {
    "max_queued_traces": (("OTEL_BSP_MAX_QUEUE_SIZE",), 1.0),
    "batch_traces": (("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",), 1.0),
    "flush_interval_s": (("OTEL_BSP_SCHEDULE_DELAY",), 0.001),
    "export_timeout_s": (
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_BSP_EXPORT_TIMEOUT"),
        0.001,
    ),
}


def _batching(policy: Telemetry, field: str, environ: Mapping[str, str]) -> float:
    """A batching setting: the policy's when it sets it, else the first standard variable set to a value
    the policy's own bounds admit (one that is not is named in a warning and passed over), else the
    policy's default."""
    configured = getattr(policy, field)
    if field in policy.model_fields_set:
        return float(configured)
    names, factor = BATCHING_VARIABLES[field]
    for name in names:
        text = environ.get(name, "").strip()
        if not text:
            continue
        try:
            value = type(configured)(float(text) * factor)  # a count stays a count
            Telemetry.model_validate({field: value})
        except (ValueError, OverflowError):  # pydantic's ValidationError is a ValueError
            log.warning("%s=%s is not a usable value; keeping %s: %g", name, text, field, configured)
            continue
        return float(value)
    return float(configured)


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
