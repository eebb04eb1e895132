"""The gateway's own headers on an answer: which route, backend and model answered, why, after how many
attempts, what it cost (settled, or the decision's estimate before a stream ends)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.request.exchange import Exchange

# An expected hit this large is shown in x-gateway-decision (smaller ones, a short system prompt say,
# only in x-gateway-expected-cached-tokens): the paid APIs cache nothing under 1,024 tokens either.
SHOWN_HIT_TOKENS = 1024


def response_headers(exchange: Exchange, content_type: str) -> list[tuple[bytes, bytes]]:
    observation = exchange.observation
    assert observation is not None
    reason = observation.decision_reason or ""
    expected = observation.predicted_cached_tokens
    if expected is not None and expected >= SHOWN_HIT_TOKENS:  # it counted on a cache hit: say so
        reason = f"{reason}; expected cache hit {expected} tokens"
    headers = [
        (b"content-type", content_type.encode()),
        (b"x-request-id", observation.request_id.encode()),
        (b"x-gateway-route", observation.route.encode()),
        (b"x-gateway-backend", (observation.backend or "").encode()),
        (b"x-gateway-upstream-model", exchange.policy.backends[observation.backend or ""].model.encode()),
        (b"x-gateway-decision", reason.encode()),
        (b"x-gateway-attempts", str(len(observation.attempts)).encode()),
    ]
    if expected is not None:
        headers.append((b"x-gateway-expected-cached-tokens", str(expected).encode()))
    if observation.queued_s > 0:
        headers.append((b"x-gateway-queued-s", f"{observation.queued_s:.3f}".encode()))
    client = exchange.client
    if client is not None and (client.notes or client.upstream_notes):
        headers.append((b"x-gateway-notes", header_text("; ".join((*client.notes, *client.upstream_notes)))))
    # Settled cost when known (non-streaming); before a stream ends, the decision's estimate.
    settled = observation.cost_usd is not None
    cost = observation.cost_usd if settled else observation.expected_cost_usd
    if cost is not None:
        basis = observation.cost_basis if settled else "expected"
        headers += [
            (b"x-gateway-cost-usd", f"{cost:.8f}".encode()),
            (b"x-gateway-cost-basis", (basis or "").encode()),
        ]
    if content_type == "text/event-stream":
        headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
    return headers


def header_text(text: str) -> bytes:
    """Printable ASCII only, and bounded: a note may quote what the client sent."""
    return "".join(c if " " <= c <= "~" else "?" for c in text[:1000]).encode()
