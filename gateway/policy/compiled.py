"""The running policy: immutable objects compiled once from a validated policy file.

Requests only ever read these. Prices are converted to USD per token, references are resolved and
credentials are read from the environment at load time, so nothing is parsed on the request path.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from gateway.policy.cache_scope import CacheScopes
from gateway.policy.schema import (
    Accounting,
    Budgets,
    Dialect,
    Fallback,
    Ledger,
    Objective,
    RateLimit,
    ResumeStyle,
    Scaling,
    Server,
    Signals,
    Slo,
    StoreSettings,
    SystemMessages,
    Thinking,
    Timeouts,
    Waiting,
    WhenInfeasible,
)
from gateway.policy.telemetry import Telemetry
from gateway.policy.tuning import Tuning
from gateway.values.auth import ApiKey


@dataclass(frozen=True, slots=True)
class TokenPrices:
    """USD per single token."""

    input: float
    cached_input: float
    output: float
    reasoning: float  # equals ``output`` unless the provider prices thinking apart


@dataclass(frozen=True, slots=True)
class PoolPrice:
    """A self-hosted pool billed by the hour, whoever uses it."""

    usd_per_hour: float
    accounting: Accounting
    assumed_tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class CompiledBackend:
    name: str
    dialect: Dialect
    base_url: str  # OpenAI base URL without trailing slash, e.g. http://10.0.0.5:8000/v1
    model: str
    token_prices: TokenPrices | None  # per-token pricing (per_token or litellm basis)
    pool_price: PoolPrice | None  # gpu_hours pricing
    thinking: Thinking
    max_concurrency: int
    context_window: int | None
    signals: Signals
    timeouts: Timeouts
    api_key: str | None = field(default=None, repr=False)  # never printed, never logged
    # Where the price came from, for people reading `gateway check` or an explanation:
    # "per_token", "gpu_hours" or "litellm:<model>" (a lookup in litellm's bundled price map).
    price_source: str = ""
    # Completion tokens to expect before any are measured (tuning.prior_output_tokens by ``thinking``);
    # None: the built-in prior for its thinking mode.
    prior_output_tokens: float | None = None
    # A pool's prompt-processing speed (tokens/s) until measured (tuning.prior_prefill_tokens_per_s).
    prior_prefill_tokens_per_s: float = 10_000.0
    family: str = ""  # the model it serves (its ``model`` unless the policy says otherwise)
    resume: ResumeStyle = "none"  # how it continues an answer another backend started
    forward_user: bool = False  # the client's identifying metadata goes to it (request/privacy.py)
    trace_context: bool = False  # the W3C traceparent goes to it (gateway/telemetry)
    # Where mid-conversation system messages go; None: as its dialect's chat templates need
    # (gateway.backends.chat_shape knows the dialects).
    system_messages: SystemMessages | None = None
    # The wire client's settings: the policy's TLS context (None: the system's), proxies from the
    # environment or not, connections per origin.
    tls: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    trust_env: bool = True
    max_connections: int = 1024
    expected_ttft_s: float | None = None  # the declared TTFT p95 until one is measured
    scaling: Scaling | None = None  # a GPU-hour pool's replicas and boot time; None: not scaled
    # Its prefix cache as the prefix index models it (schema.PrefixCache, defaults resolved).
    prefix_cache_ttl_s: float = 300.0
    prefix_cache_capacity_tokens: int = 1 << 40


@dataclass(frozen=True, slots=True)
class CompiledRoute:
    name: str
    backends: tuple[str, ...]
    slo: Slo
    objective: Objective
    when_infeasible: WhenInfeasible
    fallback: Fallback
    exploration: float
    description: str | None = None
    budgets: Budgets | None = None  # spending caps; read at admission, so a reload applies at once
    waiting: Waiting = field(default_factory=Waiting)
    admit_beyond_max_concurrency: bool = False

    @property
    def has_slo(self) -> bool:
        slo = self.slo
        return any(
            v is not None for v in (slo.ttft_p95_ms, slo.first_answer_p95_ms, slo.min_decode_tokens_per_s)
        )

    resume_streams: bool = False  # a stream cut mid-way continues on another candidate
    aliases: tuple[str, ...] = ()  # other model ids (exact or globs) that name this route
    # Candidates (indexes into ``backends``) that are replicas of one pool: same family, same price.
    # Cache affinity, guarded by load, decides among each group (policy/affinity.py).
    replica_groups: tuple[tuple[int, ...], ...] = ()
    private: bool = False  # its prompts never go into a trace


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    source: str  # file path it was loaded from
    digest: str  # sha256 of the file's bytes (and its keys file's), to tell reloads apart
    backends: Mapping[str, CompiledBackend]
    routes: Mapping[str, CompiledRoute]
    max_body_bytes: int
    # Non-fatal findings (e.g. an api_key_env that is not set), one "file:line:col path: message" each.
    warnings: tuple[str, ...] = ()
    ledger: Ledger = field(default_factory=Ledger)  # read once at start-up
    # Client keys by the hex SHA-256 of the key; empty means an open gateway (loopback only).
    api_keys: Mapping[str, ApiKey] = field(default_factory=dict)
    # Per-key rate limits by key name; read at admission, so a reload applies at once.
    rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)
    # Per-key spending caps by key name; read at admission, so a reload applies at once.
    key_budgets: Mapping[str, Budgets] = field(default_factory=dict)
    store: StoreSettings = field(default_factory=StoreSettings)  # read once at start-up
    tuning: Tuning = field(default_factory=Tuning)
    keys_file: str | None = None  # auth.keys_file resolved against the policy's directory
    server: Server = field(default_factory=Server)  # limits per process: in flight, headers, body
    # The key of the ledger's user hashes (ledger.user: hashed), read from the environment at load;
    # None: no user is recorded.
    user_hash_key: bytes | None = field(default=None, repr=False)
    # Route aliases: exact ids to route names, and globs (longest first) with their route names.
    exact_aliases: Mapping[str, str] = field(default_factory=dict)
    glob_aliases: tuple[tuple[str, str], ...] = ()
    # Who shares the prefix caches: each request's scope by route and key (policy/cache_scope.py).
    cache_scopes: CacheScopes = field(default_factory=CacheScopes)
    telemetry: Telemetry = field(default_factory=Telemetry)  # read once at start-up

    def route_for(self, model: str) -> CompiledRoute | None:
        """The route a client's model id names: a route's own name, an exact alias, or the longest
        matching glob (a more specific pattern wins; ties go to the one declared first)."""
        route = self.routes.get(model)
        if route is not None:
            return route
        name = self.exact_aliases.get(model)
        if name is None:
            name = next((route for glob, route in self.glob_aliases if fnmatchcase(model, glob)), None)
        return None if name is None else self.routes.get(name)
