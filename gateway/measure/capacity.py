"""How many replicas of a GPU-hour pool pay for themselves: the sizing model that ``gateway advise``
uses to propose plans and the live ``gateway_pool_desired_replicas`` signal uses on the recent rate.

A pool's replica is worth running while the tokens it takes off the paid API would cost more there
than the replica's hour. Traffic beyond the replicas spills to the API, which keeps the SLO, so the
cheapest plan is the one whose every replica earns its hour. Little's law turns an arrival rate into
the streams in flight: arrivals per second times how long one stream lasts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.money.costs import SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class Demand:
    """Traffic a pool could take: requests per second and the output tokens (thinking too) of one."""

    arrivals_per_s: float
    output_tokens: float


@dataclass(frozen=True, slots=True)
class ReplicaShape:
    """What one replica is: its hourly price, the streams it holds within the SLO, each one's speed."""

    usd_per_hour: float
    streams: int
    stream_tokens_per_s: float
    ttft_s: float = 1.0
    max_replicas: int = 4


def streams_in_flight(demand: Demand, shape: ReplicaShape) -> float:
    """Little's law: how many streams this traffic keeps open on the pool."""
    if demand.arrivals_per_s <= 0 or shape.stream_tokens_per_s <= 0:
        return 0.0
    duration = shape.ttft_s + demand.output_tokens / shape.stream_tokens_per_s
    return demand.arrivals_per_s * duration


def replicas_worth_running(demand: Demand, shape: ReplicaShape, api_usd_per_token: float | None) -> int:
    """The replicas whose share of the traffic would cost more on the API than their hour.

    With no API to spill to, enough replicas to hold every stream (at least one while any arrive)."""
    streams = streams_in_flight(demand, shape)
    if api_usd_per_token is None:
        wanted = math.ceil(streams / shape.streams) if streams > 0 else 0
        return min(shape.max_replicas, wanted)
    replicas = 0
    while replicas < shape.max_replicas:
        # The next replica takes a full load of streams, or what is left of them.
        taken = min(float(shape.streams), streams - replicas * shape.streams)
        api_usd_per_hour = taken * shape.stream_tokens_per_s * SECONDS_PER_HOUR * api_usd_per_token
        if taken <= 0 or api_usd_per_hour < shape.usd_per_hour:
            break
        replicas += 1
    return replicas


def break_even_arrivals_per_s(shape: ReplicaShape, output_tokens: float, api_usd_per_token: float) -> float:
    """The arrival rate above which one replica is cheaper than sending its traffic to the API."""
    streams = shape.usd_per_hour / (shape.stream_tokens_per_s * SECONDS_PER_HOUR * api_usd_per_token)
    if streams > shape.streams:
        return math.inf  # even full, a replica costs more than the API for the same tokens
    return streams / (shape.ttft_s + output_tokens / shape.stream_tokens_per_s)


def slo_streams(
    single_stream_tokens_per_s: float, batching_exponent: float, max_running: int, min_decode: float | None
) -> int:
    """Streams one replica holds while each still decodes at the SLO's minimum speed (a batching
    engine slows every stream as more run: ``speed(n) = speed(1) * n ** -exponent``)."""
    if min_decode is None or batching_exponent <= 0:
        return max_running if single_stream_tokens_per_s >= (min_decode or 0.0) else 0
    if single_stream_tokens_per_s < min_decode:
        return 0
    fits = int((single_stream_tokens_per_s / min_decode) ** (1.0 / batching_exponent))
    return max(1, min(max_running, fits))
