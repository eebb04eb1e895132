"""The policy file's strict shape: what people may write in YAML, and nothing else.

Unknown keys and wrong types are errors (``extra="forbid"``, strict scalars); the loader turns
pydantic's error locations into ``file:line:col dotted.path: message``. Models are frozen so a
loaded policy can be shared by every request without copying.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gateway.policy.strict import NonNegativeFloat, PositiveFloat, Strict
from gateway.policy.telemetry import Telemetry
from gateway.policy.tuning import Tuning

Dialect = Literal["vllm", "llamacpp", "openai", "sglang", "litellm"]
Thinking = Literal["none", "optional", "mandatory"]
Objective = Literal["lowest_cost", "lowest_ttft", "highest_throughput"]
WhenInfeasible = Literal["fastest", "cheapest", "reject"]
Accounting = Literal["amortized", "marginal"]
OnBudgetExhausted = Literal["fallback_cheaper", "reject"]
OnStoreFailure = Literal["fail_open", "fail_closed"]
WaitOrder = Literal["fifo", "deadline"]
# How a backend continues an assistant answer another backend started (a stream resumed after a cut):
# vLLM, SGLang and llama-server's ``continue_final_message``, Kimi's and DeepSeek's ``partial`` final
# assistant message, an Anthropic-style assistant prefill, or not at all.
ResumeStyle = Literal["continue_final_message", "partial", "assistant_prefill", "none"]
# Where a system message in the middle of a conversation goes (gateway.backends.chat_shape): kept at its
# place, or merged into the leading system prompt for chat templates that take only that one.
SystemMessages = Literal["in_place", "leading"]
# Other model ids a route answers to: exact ids, or globs with * and ? ("claude-*", "gpt-5*").
RouteAlias = Annotated[str, Field(pattern=r"^[A-Za-z0-9*?][A-Za-z0-9._:/*?\[\]-]*$", max_length=128)]
BackendName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]
RouteName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", max_length=128)]
# Whose prompts a request may find in the prefix cache (gateway.policy.cache_scope): everyone's, only its
# own API key's, or its key's team's.
PrefixShare = Literal["fleet", "key", "team"]


class PerTokenPrice(Strict):
    """USD per 1M tokens. Reasoning tokens are output tokens unless ``reasoning_usd_per_mtok`` is set."""

    input_usd_per_mtok: NonNegativeFloat
    output_usd_per_mtok: NonNegativeFloat
    cached_input_usd_per_mtok: NonNegativeFloat | None = None
    reasoning_usd_per_mtok: NonNegativeFloat | None = None


class LitellmPrice(Strict):
    """Look the per-token price up in litellm's bundled (offline) price map by model name."""

    model: str


class GpuHoursPrice(Strict):
    """A self-hosted pool: the whole pool's price per hour, spread over measured output tokens."""

    usd_per_hour: PositiveFloat
    accounting: Accounting = "amortized"
    # Throughput assumed until traffic has been measured (tokens/s, aggregate over the pool).
    assumed_tokens_per_s: PositiveFloat | None = None


class Pricing(Strict):
    per_token: PerTokenPrice | None = None
    litellm: LitellmPrice | None = None
    gpu_hours: GpuHoursPrice | None = None

    @model_validator(mode="after")
    def exactly_one_basis(self) -> Pricing:
        chosen = [n for n in ("per_token", "litellm", "gpu_hours") if getattr(self, n) is not None]
        if len(chosen) != 1:
            raise ValueError("give exactly one pricing basis: per_token, litellm or gpu_hours")
        return self


class Signals(Strict):
    """Where the gateway reads a backend's load and health, scraped about once a second."""

    metrics_url: str | None = None
    slots_url: str | None = None
    health_url: str | None = None
    interval_s: PositiveFloat = 1.0
    # The health GET's own deadline: SGLang's /health runs a one-token generation and cannot answer in
    # under a second (docs/contracts/sglang.yaml, health.generates), so it must not share the scrape's.
    health_timeout_s: PositiveFloat = 5.0
    # How long a backend may take from the gateway's first look to its first healthy answer while it
    # boots (vLLM and SGLang refuse connections while they load: ~27 min for Kimi K3 on vLLM); past it,
    # a backend that never came up reads as down. None: booting until the first healthy answer.
    expected_boot_s: PositiveFloat | None = None


class Timeouts(Strict):
    connect_s: PositiveFloat = 5.0
    # Longest wait for the first byte of the answer (a llama.cpp pool may take a minute).
    first_byte_s: PositiveFloat = 120.0
    # Longest silence between two chunks of a stream once it has started.
    idle_s: PositiveFloat = 60.0
    # Longest wait for a whole non-streamed answer (it arrives all at once, thinking included).
    answer_s: PositiveFloat = 600.0


class Tls(Strict):
    """How the gateway checks a backend over https, instead of the system's CA bundle, and the client
    certificate it shows (mutual TLS). Relative paths are taken from the policy file's directory."""

    ca_file: str | None = None  # PEM bundle of the CAs that may sign this backend's certificate
    cert_file: str | None = None  # PEM client certificate (its chain may follow it in the file)
    key_file: str | None = None  # its private key, when not in cert_file

    @model_validator(mode="after")
    def key_needs_cert(self) -> Tls:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file needs cert_file")
        return self


class Scaling(Strict):
    """A GPU-hour pool's replicas, for ``gateway advise`` and the live ``gateway_pool_desired_replicas``
    signal an autoscaler acts on: how long one takes to boot, how many there may be, what one holds."""

    # From starting a replica to its first answer (weights loaded, graphs captured): the signal's lead.
    boot_s: NonNegativeFloat = 0.0
    replicas: Annotated[int, Field(ge=0, le=1000)] = 1  # running today (advise's first plan)
    max_replicas: Annotated[int, Field(ge=0, le=1000)] = 4
    # Streams one replica holds within the SLO and each stream's decode speed there; default:
    # max_concurrency, and the live measured decode speed (else assumed_tokens_per_s).
    streams_per_replica: Annotated[int, Field(ge=1)] | None = None
    stream_tokens_per_s: PositiveFloat | None = None
    # The arrival rate is measured over this window; a lower desire holds this long before it shows.
    window_s: PositiveFloat = 300.0
    scale_down_after_s: NonNegativeFloat = 900.0


class PrefixCache(Strict):
    """How long the backend's own prefix cache keeps a prompt, for the gateway's prefix index
    (``gateway.measure.prefix_index``): a paid API's cache lives minutes after its last use; a pool's
    KV cache keeps what fits in its capacity, least recently used out first. The TTL in use is adjusted
    by the cached tokens the backend reports. Defaults: ``ttl_s`` 300 (the paid APIs' 5 minutes) for
    per-token prices, 3600 for a GPU-hour pool; ``capacity_tokens`` 4,194,304 for a pool (set it to
    your engine's KV cache size: vLLM logs "GPU KV cache size: N tokens"), unbounded for a paid API."""

    ttl_s: PositiveFloat | None = None
    capacity_tokens: Annotated[int, Field(ge=1)] | None = None


class PrefixSharing(Strict):
    """Who shares the engines' prefix caches, and so who may learn (from the expected cached tokens the
    gateway reports, or from the engine's TTFT) that a prompt was sent before: ``fleet`` (every key;
    a common system prompt is prefilled once for all), ``key`` (each API key alone: the requests carry
    the engine's ``cache_salt`` where it has one, and the gateway's prefix index is kept per key) or
    ``team`` (the keys of one ``auth.keys[].team``). Default: ``key`` on a route that more than one key
    may use, else ``fleet``. Set on a route, or on a key (which wins over its route's)."""

    share: PrefixShare


class Backend(Strict):
    dialect: Dialect
    url: Annotated[str, Field(pattern=r"^https?://")]
    model: str
    # Name of the environment variable holding the credential: secrets never live in the file.
    api_key_env: str | None = None
    pricing: Pricing
    thinking: Thinking = "none"
    max_concurrency: Annotated[int, Field(ge=1)] = 64
    context_window: Annotated[int, Field(ge=1)] | None = None
    signals: Signals = Signals()
    timeouts: Timeouts = Timeouts()
    # The model this backend serves, for telling whether another backend can continue its answers;
    # defaults to ``model``. Give the same family to backends that serve the same weights.
    family: str | None = None
    # How it continues an answer cut elsewhere; default: continue_final_message for vllm, sglang and
    # llamacpp, else none.
    resume: ResumeStyle | None = None
    # Privacy: whether the client's identifying metadata (OpenAI ``user``, ``safety_identifier``,
    # ``metadata``, Codex ``client_metadata``, Anthropic ``metadata.user_id``) goes to this backend.
    # Off by default, so no paid API learns who uses it unless the policy says so here.
    forward_user: bool = False
    # Tracing: whether the W3C traceparent/tracestate go to it, so the engine's own spans join the
    # gateway's trace. Default: on for vllm, sglang and llamacpp (self-hosted), off for a paid API.
    trace_context: bool | None = None
    # Mid-conversation system messages: default by dialect (leading for llamacpp and litellm).
    system_messages: SystemMessages | None = None
    # How the gateway reaches it (the wire client; not for dialect litellm, which has its own client).
    tls: Tls | None = None
    # Take HTTP_PROXY / HTTPS_PROXY / NO_PROXY from the environment for this backend (as httpx's
    # trust_env does); false: always connect directly.
    trust_env: bool = True
    # Connections open at once to its origin; more requests wait (in order) for one to come back.
    max_connections: Annotated[int, Field(ge=1, le=65_536)] = 1024
    # Its time to first token (ms, as a p95) until probes or traffic have measured it: a candidate
    # declared outside a route's TTFT SLO gets none of that route's requests while another is within
    # it, from the first request of a fresh gateway on. Unset: unknown until measured.
    expected_ttft_ms: PositiveFloat | None = None
    scaling: Scaling | None = None  # a GPU-hour pool's replicas (autoscaling signal, advise)
    prefix_cache: PrefixCache = PrefixCache()  # its prompt cache's lifetime and size (cache-aware routing)


class Slo(Strict):
    ttft_p95_ms: PositiveFloat | None = None
    min_decode_tokens_per_s: PositiveFloat | None = None
    # Thinking models: time until the first *answer* (content) token, reasoning excluded.
    first_answer_p95_ms: PositiveFloat | None = None


class Fallback(Strict):
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    deadline_s: PositiveFloat = 600.0
    # A stream cut after its first byte goes on from the next candidate that can continue it.
    # Default: on when every candidate serves the same ``family``.
    resume_streams: bool | None = None


class Waiting(Strict):
    """When every candidate is full (max concurrency) or paused (rate-limited upstream), a request waits
    here, bounded in time and count, and takes the first candidate that frees; past the bound it gets
    429 with Retry-After."""

    max_wait_s: NonNegativeFloat = 10.0  # 0: never wait
    max_waiting: Annotated[int, Field(ge=0, le=100_000)] = 256
    # Who goes first when a candidate frees: arrival order, or the nearest route deadline.
    order: WaitOrder = "fifo"


class Budgets(Strict):
    """Spending caps in USD (UTC day and month), counted from the ledger's cost of each request."""

    per_day_usd: NonNegativeFloat | None = None
    per_month_usd: NonNegativeFloat | None = None
    # When the cap cannot cover a request: try a cheaper candidate that fits, or answer 429.
    on_exhausted: OnBudgetExhausted = "reject"

    @model_validator(mode="after")
    def some_limit(self) -> Budgets:
        if self.per_day_usd is None and self.per_month_usd is None:
            raise ValueError("give per_day_usd, per_month_usd or both")
        return self


class Route(Strict):
    backends: Annotated[list[BackendName], Field(min_length=1)]
    slo: Slo = Slo()
    objective: Objective = "lowest_cost"
    when_infeasible: WhenInfeasible = "fastest"
    fallback: Fallback = Fallback()
    # Share of requests sent to a non-chosen healthy candidate to keep its measurements fresh.
    # Only on routes without an SLO: routes with one keep their stats fresh with probes instead.
    exploration: Annotated[float, Field(ge=0, le=0.5)] = 0.02
    description: str | None = None
    budgets: Budgets | None = None
    waiting: Waiting = Waiting()
    # Send a request to a pool already at max_concurrency when its predicted TTFT (its own queue
    # included) still meets the route's TTFT SLO: fill a pool to what its SLO allows.
    admit_beyond_max_concurrency: bool = False
    # Model ids clients send that mean this route (a client's own default, say); none may be claimed
    # by two routes. The route's name still comes first, then exact aliases, then the longest glob.
    aliases: list[RouteAlias] = []
    # Who shares the prefix cache on this route (PrefixSharing); unset: per key when keys share it.
    prefix_cache: PrefixSharing | None = None
    # Its prompts and answers never go into a trace, whatever ``telemetry.content`` says.
    private: bool = False


class Server(Strict):
    """What one gateway process lets its clients hold: bytes, time and requests in flight. The two
    header settings and ``keep_alive_s`` belong to the connection and are read at start-up; the others
    on every request, so a reload applies them at once."""

    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    # Completion requests this process serves at once (streams included), over every route and door;
    # one more is refused with 503 and Retry-After before its body is read, so shedding costs almost
    # nothing and memory stays bounded whatever the load. Per worker with ``serve --workers``.
    max_in_flight: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    # The Retry-After (seconds) such a refusal carries.
    shed_retry_after_s: Annotated[int, Field(ge=1, le=3600)] = 1
    # A request's line and headers must arrive within this long of its first byte (or of the
    # connection opening), else the connection gets 408 and is closed: slow-loris clients do not pile up.
    header_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    # Request line plus headers beyond this many bytes: 431 and the connection closed.
    max_header_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = 64 * 1024
    # The whole body must arrive within this long of the headers, else 408 and the connection closed.
    body_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    # A client's kept-alive connection idle this long after its last answer is closed. Behind a load
    # balancer that reuses connections, set it above the balancer's own idle timeout (60 s on an AWS
    # ALB), else the balancer may send a request down a connection the gateway is closing (a 502).
    keep_alive_s: Annotated[float, Field(gt=0, le=3600)] = 5.0


class Ledger(Strict):
    """Where the per-request spend rows go, written in batches off the request path: a SQLite file
    (``path``, the default) or, for a fleet, the PostgreSQL database named by ``url``.

    A relative path is taken from the directory the gateway is started in; ``gateway serve --ledger``
    (or env GATEWAY_LEDGER) overrides both. Put no password in ``url``: libpq reads PGPASSWORD or
    ~/.pgpass. Changes take effect at the next start, not on a hot reload.
    """

    path: Annotated[str, Field(min_length=1)] = "var/ledger.sqlite3"
    url: Annotated[str | None, Field(pattern=r"^postgres(ql)?://")] = None
    flush_interval_s: PositiveFloat = 1.0
    batch_size: Annotated[int, Field(ge=1, le=100_000)] = 500
    # Where rows wait while the database is away (a SQLite spool file per ledger, fsynced each move;
    # the database gets them when it is back, this start or the next); and how long a shutdown keeps
    # retrying the database when the spool cannot take its rows either.
    spool_dir: Annotated[str, Field(min_length=1)] = "var/ledger-spool"
    # Billable rows held in memory when neither the database nor the spool takes them; past it the
    # oldest is dropped (and counted). Refused requests have a bound of their own.
    max_pending_rows: Annotated[int, Field(ge=100, le=10_000_000)] = 200_000
    close_timeout_s: Annotated[float, Field(ge=0, le=600)] = 20.0
    # PostgreSQL: how long a write may go unanswered before the server is taken as hung (a frozen host,
    # a partition): the connection is cut and the rows go to the spool instead of waiting in memory.
    answer_timeout_s: Annotated[float, Field(gt=0, le=600)] = 20.0
    # Per-user spend: "hashed" keeps a keyed hash (HMAC-SHA256) of the client's user id in each row,
    # never the id itself; the key is read from the environment variable ``user_hash_key_env`` names
    # (unset: no user is recorded, and the policy says so). "none" (the default) records no user.
    user: Literal["none", "hashed"] = "none"
    user_hash_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "GATEWAY_USER_HASH_KEY"


class RateLimit(Strict):
    """Per-key limits over a sliding minute, held fleet-wide when replicas share a store.

    Tokens are prompt plus completion tokens; admission reserves the request's ``max_tokens`` (or its
    predicted output) and the end of the request settles the reservation with the real usage.
    """

    requests_per_minute: Annotated[int, Field(ge=1)] | None = None
    tokens_per_minute: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def some_limit(self) -> RateLimit:
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ValueError("give requests_per_minute, tokens_per_minute or both")
        return self


class ApiKeyEntry(Strict):
    """One client key, stored as the SHA-256 of the key (``gateway keys create NAME`` prints both)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$", max_length=64)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    # Route names this key may use; "*" for all of them.
    routes: Annotated[list[str], Field(min_length=1)] = ["*"]
    # Admin keys also reach /admin/*, /dashboard and, unless it has its own port, /metrics.
    admin: bool = False
    rate_limit: RateLimit | None = None
    # Spending caps of this key, on top of its routes' own; its spend is counted either way.
    budgets: Budgets | None = None
    # Keys of one team may share their prefix cache (``prefix_cache: {share: team}``).
    team: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$", max_length=64)] | None = None
    # Who this key's requests share the prefix cache with, over its routes' own setting.
    prefix_cache: PrefixSharing | None = None


class Auth(Strict):
    """With no keys the gateway serves without auth, and only on a loopback address."""

    keys: list[ApiKeyEntry] = []
    # More keys from a file of their own (``keys:`` as here), e.g. a mounted Kubernetes Secret, so
    # rotating keys never touches the routing policy; relative to the policy file's directory. Read at
    # every (re)load; a missing file adds no keys (and a public gateway with no keys does not start).
    keys_file: Annotated[str, Field(min_length=1, max_length=4096)] | None = None


class KeysFile(Strict):
    """The file that ``auth.keys_file`` names."""

    keys: list[ApiKeyEntry] = []


class StoreSettings(Strict):
    """Where budgets, rate limits, circuit state and live stats are shared: in this process (no
    ``redis_url``) or in Redis for several replicas. Read at start-up; ``gateway serve --redis-url`` (or
    GATEWAY_REDIS_URL) overrides ``redis_url``, and is the place for a URL that carries a password.
    """

    redis_url: Annotated[str, Field(pattern=r"^(redis|rediss|memory)://")] | None = None
    # Redis unreachable or slow: serve on this replica's own counts, or answer 503.
    on_failure: OnStoreFailure = "fail_open"
    # Longest wait for Redis on the request path before counting it as a fault.
    timeout_ms: Annotated[float, Field(gt=0, le=10_000)] = 100.0
    key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9:_.-]{0,64}$")] = "gw:"
    # How often each replica shares its measurements and reads the others'.
    sync_interval_s: Annotated[float, Field(ge=0.05, le=60)] = 0.5


class PolicyFile(Strict):
    version: Literal[1] = 1
    server: Server = Server()
    backends: Annotated[dict[BackendName, Backend], Field(min_length=1)]
    routes: Annotated[dict[RouteName, Route], Field(min_length=1)]
    ledger: Ledger = Ledger()
    auth: Auth = Auth()
    store: StoreSettings = StoreSettings()
    tuning: Tuning = Tuning()
    telemetry: Telemetry = Telemetry()
