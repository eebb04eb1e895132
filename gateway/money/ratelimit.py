"""Per-key rate limits: requests and tokens per sliding minute, fleet-wide through the store. A token
limit reserves what a request may use at admission (prompt plus ``max_tokens``, else its predicted
output) and settles with the real usage when it ends."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.errors import GatewayError
from gateway.policy.compiled import CompiledPolicy
from gateway.policy.decide import Decision
from gateway.policy.schema import RateLimit
from gateway.store import Store, Verdict, WindowCharge
from gateway.values.observation import Observation


class RateLimited(GatewayError):
    """429 in OpenAI's shape, with when to retry."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    refusal = True

    def __init__(self, message: str, unit: str, limit: float, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.unit, self.limit, self.retry_after_s = unit, limit, retry_after_s

    def headers(self) -> dict[str, str]:
        headers = {f"x-ratelimit-limit-{self.unit}": str(int(self.limit))}
        if self.retry_after_s is not None:
            headers[f"x-ratelimit-remaining-{self.unit}"] = "0"
            headers[f"x-ratelimit-reset-{self.unit}"] = f"{self.retry_after_s:.3f}s"
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
        return headers


@dataclass(frozen=True, slots=True)
class HeldTokens:
    key: str
    amount: float
    bucket: int
    held_in: int


def window_key(key_name: str, unit: str) -> str:
    return f"ratelimit:key:{key_name}:{unit}"


class RateLimits:
    def __init__(self, store: Store) -> None:
        self.store = store

    def charges(
        self, observation: Observation, prompt_tokens: int, decision: Decision, policy: CompiledPolicy
    ) -> tuple[WindowCharge, ...]:
        """What the request takes from its key's windows; a request larger than a whole minute's
        tokens is refused here, since no wait would let it through."""
        name = observation.api_key_name
        limit = None if name is None else policy.rate_limits.get(name)
        if name is None or limit is None:
            return ()
        charges = []
        if limit.requests_per_minute is not None:
            charges.append(WindowCharge(window_key(name, "requests"), limit.requests_per_minute, 1.0))
        if limit.tokens_per_minute is not None:
            charges.append(self._tokens(name, limit, observation, prompt_tokens, decision))
        return tuple(charges)

    def counting(self, key_name: str | None, policy: CompiledPolicy) -> tuple[WindowCharge, ...]:
        """What a token count (``/v1/messages/count_tokens``) takes: one request from a window of its
        own at the key's requests per minute. Anthropic limits counting apart from messages; here
        counts are neither unlimited (each one is work) nor taken from the key's messages."""
        limit = None if key_name is None else policy.rate_limits.get(key_name)
        if key_name is None or limit is None or limit.requests_per_minute is None:
            return ()
        key = window_key(key_name, "count_tokens") + ":requests"
        return (WindowCharge(key, limit.requests_per_minute, 1.0),)

    def refused(self, verdict: Verdict, charges: tuple[WindowCharge, ...], key_name: str) -> RateLimited:
        charge = charges[verdict.window]
        unit = charge.key.rpartition(":")[2]
        return RateLimited(
            f"rate limit of API key '{key_name}' reached: {charge.limit:.0f} {unit} per minute, and this "
            f"request needs {charge.amount:.0f} more; retry in {verdict.retry_after_s:.1f}s",
            unit,
            charge.limit,
            verdict.retry_after_s,
        )

    @staticmethod
    def held(charges: tuple[WindowCharge, ...], verdict: Verdict) -> HeldTokens | None:
        """The token reservation an admitted request holds, to settle with its real usage."""
        for charge in charges:
            if charge.key.endswith(":tokens"):
                return HeldTokens(charge.key, charge.amount, verdict.bucket, verdict.held_in)
        return None

    def settle(self, held: HeldTokens | None, observation: Observation) -> None:
        if held is None:
            return
        used = sum(a.usage.prompt_tokens + a.usage.completion_tokens for a in observation.attempts if a.usage)
        if used != held.amount:
            self.store.settle_window(held.key, held.bucket, used - held.amount, held.held_in)

    def _tokens(
        self, name: str, limit: RateLimit, observation: Observation, prompt: int, decision: Decision
    ) -> WindowCharge:
        per_minute = float(limit.tokens_per_minute or 0)
        if observation.max_tokens is not None:
            wanted = float(prompt + observation.max_tokens)
            if wanted > per_minute:
                raise RateLimited(
                    f"request too large for API key '{name}': about {prompt} prompt tokens plus max_tokens "
                    f"{observation.max_tokens} exceed its {per_minute:.0f} tokens per minute",
                    "tokens",
                    per_minute,
                    None,
                )
        else:
            predicted = next(
                (e.predicted_output_tokens for e in decision.evals if e.backend == decision.chosen), 0.0
            )
            wanted = min(prompt + predicted, per_minute)
        return WindowCharge(window_key(name, "tokens"), per_minute, wanted)
