"""What a simulation replays: the workload file (arrivals over the day or a ramp, prompt and output
lengths, thinking share, route mix), the backends' performance models, and faults on the timeline.

Files are YAML or JSON, parsed strictly (unknown keys are errors); requests are generated from a seed.
"""

from __future__ import annotations

import bisect
import calendar
import math
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.emulator.profiles import PROFILES, Profile, resolve_profile

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
DEFAULT_START = "2026-01-01T00:00:00Z"  # a UTC midnight: daily budgets reset at the day's end
# A policy backend's performance model when the workload names none: the emulator of its dialect.
PROFILE_OF_DIALECT: Mapping[str, str] = {
    "vllm": "b300-vllm",
    "llamacpp": "a100-llamacpp",
    "openai": "paid-api",
}


class WorkloadError(ValueError):
    """A workload file that does not load; the message names the file and every problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ramp(_Strict):
    """Arrivals per second growing linearly from ``from_rps`` to ``to_rps`` over the run."""

    from_rps: NonNegative
    to_rps: NonNegative


class Arrivals(_Strict):
    """Either a curve of (hour of the run, requests per second) points, linear between them, or a ramp."""

    curve: list[tuple[NonNegative, NonNegative]] | None = None
    ramp: Ramp | None = None
    scale: Positive = 1.0  # multiplies every rate: the same day at twice the traffic

    @model_validator(mode="after")
    def _one_shape(self) -> Arrivals:
        if (self.curve is None) == (self.ramp is None):
            raise ValueError("give exactly one of curve or ramp")
        if self.curve is not None and len(self.curve) < 2:
            raise ValueError("a curve needs at least two points")
        return self


class Lengths(_Strict):
    """Token counts: lognormal around ``median`` (``sigma`` in log space), clipped to [min, max]."""

    median: Positive
    sigma: NonNegative = 0.0
    min: int = Field(1, ge=0)
    max: int = Field(1_000_000, ge=1)

    def draw(self, rng: random.Random) -> int:
        value = self.median if self.sigma == 0 else rng.lognormvariate(math.log(self.median), self.sigma)
        return int(min(self.max, max(self.min, round(value))))


class RequestShape(_Strict):
    prompt_tokens: Lengths
    output_tokens: Lengths  # completion tokens the model will produce, reasoning included
    thinking_share: float = Field(0.6, ge=0.0, le=1.0)  # share of output tokens that are reasoning
    routes: dict[str, Positive]  # route -> weight
    stream: bool = True
    # Sent as the request's max_tokens (a cap the decision sees); None sends none.
    max_tokens: int | None = Field(None, ge=1)


class BackendModel(_Strict):
    """A policy backend's performance model: an emulator profile, with parameters changed if asked."""

    profile: str | None = None  # default: the emulator profile of the backend's dialect
    overrides: dict[str, Any] = Field(default_factory=dict)


FaultKind = Literal["down", "slow", "booting", "errors"]


class Fault(_Strict):
    """One backend misbehaving for a window of the run (seconds from its start)."""

    backend: str
    kind: FaultKind
    start_s: NonNegative
    end_s: Positive
    slowdown: Positive = 1.0  # slow: divides decode speed
    added_ttft_ms: NonNegative = 0.0  # slow: added before the first token
    error_rate: float = Field(1.0, ge=0.0, le=1.0)  # errors: share of requests answered with HTTP 500

    @model_validator(mode="after")
    def _ordered(self) -> Fault:
        if self.end_s <= self.start_s:
            raise ValueError("end_s must be after start_s")
        return self


class WorkloadFile(_Strict):
    name: str = "workload"
    seed: int = 0
    duration_s: Positive = 86_400.0
    start: str = DEFAULT_START  # ISO UTC wall time of the run's start: budgets' days and months
    arrivals: Arrivals | None = None  # None only for a ledger replay
    requests: RequestShape | None = None
    backends: dict[str, BackendModel] = Field(default_factory=dict)
    faults: list[Fault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _synthetic_needs_both(self) -> WorkloadFile:
        if (self.arrivals is None) != (self.requests is None):
            raise ValueError("a synthetic workload needs both arrivals and requests")
        return self


# A prompt's shape for the prefix caches: (ends, hashes), the prompt tokens up to each message
# boundary and a hash chained over every message up to it (gateway.measure.prefix_index's PromptKeys).
PromptShape = tuple[tuple[int, ...], tuple[int, ...]]


class SimRequest(NamedTuple):
    """One request of the workload; ``at`` is seconds from the run's start."""

    at: float
    route: str
    prompt_tokens: int
    output_tokens: int  # what the model produces if nothing caps it
    reasoning_tokens: int
    max_tokens: int | None
    stream: bool
    session: int = -1  # an agent session's number (agents.py); -1: a one-off request
    shape: PromptShape | None = None  # None: a prompt no cache can help (unique from its first token)


class Workload(NamedTuple):
    name: str
    requests: list[SimRequest]
    duration_s: float
    start_wall: float  # Unix seconds of the run's start
    backends: Mapping[str, BackendModel]
    faults: tuple[Fault, ...]
    seed: int


def read_workload_file(path: str | Path) -> WorkloadFile:
    import orjson
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise WorkloadError(f"{source}: cannot read the workload: {exc.strerror or exc}") from None
    try:
        data = orjson.loads(text) if source.suffix == ".json" else YAML(typ="safe").load(text)
    except (orjson.JSONDecodeError, YAMLError) as exc:
        raise WorkloadError(f"{source}: not valid {source.suffix.lstrip('.') or 'YAML'}: {exc}") from None
    try:
        return WorkloadFile.model_validate(data)
    except ValidationError as exc:
        problems = "\n".join(f"  {'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise WorkloadError(f"{source}: the workload does not validate:\n{problems}") from None


def parse_start(iso: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(iso.rstrip("Z"), "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        raise WorkloadError(f"start {iso!r} is not a UTC time like {DEFAULT_START}") from None


def synthesize(spec: WorkloadFile) -> Workload:
    """The requests of a synthetic workload: a Poisson process whose rate follows the curve or ramp."""
    if spec.arrivals is None or spec.requests is None:
        raise WorkloadError("this workload has no arrivals and requests to synthesize (a ledger replay?)")
    rng = random.Random(spec.seed)
    shape = spec.requests
    routes = list(shape.routes)
    cumulative: list[float] = []
    total = 0.0
    for route in routes:
        total += shape.routes[route]
        cumulative.append(total)
    rate = arrival_rate(spec.arrivals, spec.duration_s)
    peak = max(rate(t) for t in _probe_times(spec.arrivals, spec.duration_s))
    requests: list[SimRequest] = []
    at = 0.0
    while peak > 0:
        at += rng.expovariate(peak)
        if at >= spec.duration_s:
            break
        if rng.random() * peak > rate(at):
            continue  # thinning: keep each candidate with probability rate(at) / peak
        route = routes[bisect.bisect_left(cumulative, rng.random() * total)]
        output = shape.output_tokens.draw(rng)
        reasoning = round(output * shape.thinking_share)
        prompt = shape.prompt_tokens.draw(rng)
        requests.append(SimRequest(at, route, prompt, output, reasoning, shape.max_tokens, shape.stream))
    return Workload(
        spec.name,
        requests,
        spec.duration_s,
        parse_start(spec.start),
        spec.backends,
        tuple(spec.faults),
        spec.seed,
    )


def requests_between(requests: list[SimRequest], start: float, end: float, *, last: bool) -> list[SimRequest]:
    """The requests arriving in [start, end) (to the last one when ``last``); ``requests`` by arrival."""
    lo = bisect.bisect_left(requests, start, key=lambda r: r.at)
    hi = len(requests) if last else bisect.bisect_left(requests, end, key=lambda r: r.at)
    return requests[lo:hi]


def arrival_rate(arrivals: Arrivals, duration_s: float) -> Callable[[float], float]:
    """Requests per second at ``t`` seconds into the run."""
    scale = arrivals.scale
    if arrivals.ramp is not None:
        a, b = arrivals.ramp.from_rps, arrivals.ramp.to_rps
        return lambda t: scale * (a + (b - a) * min(1.0, t / duration_s))
    assert arrivals.curve is not None
    points = sorted((hour * 3600.0, rps) for hour, rps in arrivals.curve)
    xs = [x for x, _ in points]

    def rate(t: float) -> float:
        i = bisect.bisect_right(xs, t)
        if i == 0:
            return scale * points[0][1]
        if i >= len(points):
            return scale * points[-1][1]
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        return scale * (y0 + (y1 - y0) * (t - x0) / (x1 - x0))

    return rate


def _probe_times(arrivals: Arrivals, duration_s: float) -> list[float]:
    if arrivals.curve is None:
        return [0.0, duration_s]
    return [0.0, duration_s, *(hour * 3600.0 for hour, _ in arrivals.curve)]


def backend_profile(model: BackendModel | None, dialect: str) -> Profile:
    """The performance model of one policy backend: its named profile with any overrides."""
    name = (model.profile if model is not None else None) or PROFILE_OF_DIALECT[dialect]
    if name not in PROFILES:
        raise WorkloadError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    profile = resolve_profile(name)
    if model is None or not model.overrides:
        return profile
    try:
        return profile.with_overrides(model.overrides)
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
