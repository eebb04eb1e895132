"""Load a policy file: YAML with positions (document.py), strict validation, then compilation.

Every problem names ``file:line:col dotted.path``. A policy that loads is ready to serve: prices are
evaluated, references resolved and credentials read here, never on a request.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import types
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from gateway.policy import schema
from gateway.policy.affinity import replica_groups
from gateway.policy.aliases import alias_problems, compiled_aliases
from gateway.policy.api_keys import (
    compile_keys,
    key_problems,
    keys_file_path,
    keys_from_file,
    read_keys_file,
    with_keys_digest,
)
from gateway.policy.cache_scope import compile_cache_scopes
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute, PoolPrice
from gateway.policy.document import (
    Document,
    PolicyError,
    PolicyFileUnreadable,
    Problem,
    decode,
    parse,
)
from gateway.policy.prices import BackendProblem, backend_prices, probe_cost, require_litellm
from gateway.policy.reach import ReachProblem, api_key, clean, tls_context
from gateway.policy.telemetry import traced
from gateway.policy.tuning import Tuning

__all__ = ["PolicyError", "PolicyFileUnreadable", "Problem", "compile_policy_bytes", "load_policy"]

Env = Mapping[str, str] | None  # where api_key_env is looked up; None means os.environ
# How each dialect continues an answer unless the policy says: vLLM and SGLang servers take
# ``continue_final_message``; a plain OpenAI-compatible API cannot be assumed to.
# llama-server takes continue_final_message too (with add_generation_prompt false; llama.cpp
# tools/server/server-common.cpp:1322-1336 as vendored by llama-cpp-python 0.3.36).
DEFAULT_RESUME: Mapping[str, schema.ResumeStyle] = types.MappingProxyType(
    {
        "vllm": "continue_final_message",
        "sglang": "continue_final_message",
        "llamacpp": "continue_final_message",
    }
)


def load_policy(path: str | Path, *, environ: Env = None) -> CompiledPolicy:
    """Read, validate and compile the policy file at ``path``; raise PolicyError naming every problem."""
    return compile_policy_bytes(read_policy_file(path), str(path), environ=environ)


def read_policy_file(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        message = f"cannot read the policy file: {exc.strerror or exc}"
        raise PolicyFileUnreadable([Problem(str(path), 0, 0, "", message)]) from None


def compile_policy_bytes(data: bytes, source: str, *, environ: Env = None) -> CompiledPolicy:
    """Compile a policy file's bytes; the digest is theirs, so it matches the file's sha256."""
    return _compile(decode(data, source), source, hashlib.sha256(data).hexdigest(), environ)


def compile_policy_text(text: str, source: str, *, environ: Env = None) -> CompiledPolicy:
    """Like load_policy for text already in memory; ``source`` is the name problems are reported under."""
    return _compile(text, source, hashlib.sha256(text.encode()).hexdigest(), environ)


def _compile(text: str, source: str, digest: str, environ: Env) -> CompiledPolicy:
    doc = parse(text, source)
    try:
        raw = schema.PolicyFile.model_validate(doc.plain)
    except ValidationError as exc:
        raise PolicyError(
            doc.schema_problems(exc) + doc.nonfinite_problems() + _reference_problems(doc)
        ) from None
    keys_path = keys_file_path(raw.auth.keys_file, source)
    keys_data = read_keys_file(keys_path)
    digest = with_keys_digest(digest, keys_path, keys_data)
    if keys_data is not None:
        auth = raw.auth.model_copy(update={"keys": raw.auth.keys + keys_from_file(keys_path, keys_data)})
        raw = raw.model_copy(update={"auth": auth})
    problems = doc.nonfinite_problems() + _reference_problems(doc) + key_problems(raw, doc)
    problems += alias_problems(raw, doc)
    warnings = _unused_backend_warnings(raw, doc)
    if keys_path is not None and keys_data is None:
        missing = f"{keys_path} does not exist; no keys from it"
        warnings.append(doc.problem(("auth", "keys_file"), missing))
    backends: dict[str, CompiledBackend] = {}
    env = os.environ if environ is None else environ
    for name, backend in raw.backends.items():
        try:
            backends[name] = _compile_backend(name, backend, env, raw.tuning, Path(source).parent)
        except (BackendProblem, ReachProblem) as exc:
            problems.append(doc.problem(("backends", name, *exc.loc), exc.message))
        if backend.api_key_env is not None and name in backends and backends[name].api_key is None:
            unset = f"environment variable {backend.api_key_env} is not set; requests go without a key"
            warnings.append(doc.problem(("backends", name, "api_key_env"), unset))
    user_hash_key = None
    if raw.ledger.user == "hashed":
        user_hash_key = env.get(raw.ledger.user_hash_key_env, "").encode() or None
        if user_hash_key is None:
            unset = f"environment variable {raw.ledger.user_hash_key_env} is not set; no user is recorded"
            warnings.append(doc.problem(("ledger", "user"), unset))
    if problems:
        raise PolicyError(problems)
    routes = {name: _compile_route(name, route, backends) for name, route in raw.routes.items()}
    exact_aliases, glob_aliases = compiled_aliases(raw)
    return CompiledPolicy(
        source=source,
        digest=digest,
        backends=types.MappingProxyType(backends),
        routes=types.MappingProxyType(routes),
        max_body_bytes=raw.server.max_body_bytes,
        server=raw.server,
        warnings=tuple(str(w) for w in sorted(warnings, key=lambda p: (p.line, p.column))),
        ledger=raw.ledger,
        user_hash_key=user_hash_key,
        api_keys=types.MappingProxyType(compile_keys(raw.auth)),
        key_budgets=types.MappingProxyType(
            {entry.name: entry.budgets for entry in raw.auth.keys if entry.budgets is not None}
        ),
        rate_limits=types.MappingProxyType(
            {entry.name: entry.rate_limit for entry in raw.auth.keys if entry.rate_limit is not None}
        ),
        store=raw.store,
        tuning=raw.tuning,
        keys_file=keys_path,
        exact_aliases=types.MappingProxyType(exact_aliases),
        glob_aliases=glob_aliases,
        cache_scopes=compile_cache_scopes(raw),
        telemetry=raw.telemetry,
    )


# --- checks beyond the schema, and compilation ------------------------------------------------------


def _reference_problems(doc: Document) -> list[Problem]:
    """Route entries naming no backend; read from the plain data so they show up beside schema errors."""
    backends, routes = doc.plain.get("backends"), doc.plain.get("routes")
    if not isinstance(backends, dict) or not isinstance(routes, dict):
        return []
    problems, defined = [], sorted(str(name) for name in backends)
    for route_name, route in routes.items():
        names = route.get("backends") if isinstance(route, dict) else None
        if not isinstance(names, list):
            continue
        for i, name in enumerate(names):
            loc = ("routes", route_name, "backends", i)
            if name in names[:i]:
                problems.append(doc.problem(loc, f"backend {name!r} is listed twice"))
            elif isinstance(name, str) and name not in backends:
                hint = difflib.get_close_matches(name, defined, n=1)
                did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
                message = f"unknown backend {name!r}{did_you_mean}; defined backends: {', '.join(defined)}"
                problems.append(doc.problem(loc, message))
    return problems


def _unused_backend_warnings(policy: schema.PolicyFile, doc: Document) -> list[Problem]:
    used = {name for route in policy.routes.values() for name in route.backends}
    return [doc.problem(("backends", n), "not used by any route") for n in policy.backends if n not in used]


def _compile_backend(
    name: str, backend: schema.Backend, environ: Mapping[str, str], tuning: Tuning, base_dir: Path
) -> CompiledBackend:
    signals = backend.signals
    for field in ("metrics_url", "slots_url", "health_url"):
        url = getattr(signals, field)
        if url is not None:
            signals = signals.model_copy(update={field: clean(url, ("signals", field))})
    if backend.dialect == "litellm":
        require_litellm(("dialect",))
    token_prices, pool_price, price_source = backend_prices(backend.pricing)
    probe_cost(token_prices, pool_price)
    return CompiledBackend(
        name=name,
        dialect=backend.dialect,
        base_url=clean(backend.url, ("url",)),
        model=backend.model,
        token_prices=token_prices,
        pool_price=pool_price,
        thinking=backend.thinking,
        max_concurrency=backend.max_concurrency,
        context_window=backend.context_window,
        signals=signals,
        timeouts=backend.timeouts,
        api_key=api_key(backend.api_key_env, environ),
        price_source=price_source,
        prior_output_tokens=getattr(tuning.prior_output_tokens, backend.thinking),
        prior_prefill_tokens_per_s=tuning.prior_prefill_tokens_per_s,
        family=backend.family or backend.model,
        resume=backend.resume or DEFAULT_RESUME.get(backend.dialect, "none"),
        forward_user=backend.forward_user,
        trace_context=traced(backend.dialect, backend.trace_context),
        system_messages=backend.system_messages,
        tls=None if backend.tls is None else tls_context(backend.tls, base_dir),
        trust_env=backend.trust_env,
        max_connections=backend.max_connections,
        expected_ttft_s=None if backend.expected_ttft_ms is None else backend.expected_ttft_ms / 1000.0,
        scaling=_scaling(backend, pool_price),
        prefix_cache_ttl_s=_prefix_ttl(backend.prefix_cache, pool_price),
        prefix_cache_capacity_tokens=_prefix_capacity(backend.prefix_cache, pool_price),
    )


# A pool's KV cache keeps what fits (capacity decides, not time); a paid API's lives 5 minutes.
POOL_PREFIX_TTL_S = 3600.0
API_PREFIX_TTL_S = 300.0
POOL_PREFIX_CAPACITY_TOKENS = 4_194_304
API_PREFIX_CAPACITY_TOKENS = 1 << 40  # unbounded: the index's own entry bound holds its memory


def _prefix_ttl(cache: schema.PrefixCache, pool_price: PoolPrice | None) -> float:
    if cache.ttl_s is not None:
        return cache.ttl_s
    return API_PREFIX_TTL_S if pool_price is None else POOL_PREFIX_TTL_S


def _prefix_capacity(cache: schema.PrefixCache, pool_price: PoolPrice | None) -> int:
    if cache.capacity_tokens is not None:
        return cache.capacity_tokens
    return API_PREFIX_CAPACITY_TOKENS if pool_price is None else POOL_PREFIX_CAPACITY_TOKENS


def _scaling(backend: schema.Backend, pool_price: PoolPrice | None) -> schema.Scaling | None:
    if backend.scaling is not None and pool_price is None:
        raise BackendProblem(("scaling",), "only a gpu_hours pool has replicas to scale")
    return backend.scaling


def _compile_route(name: str, r: schema.Route, backends: Mapping[str, CompiledBackend]) -> CompiledRoute:
    candidates = [backends[b] for b in r.backends if b in backends]
    resume_streams = r.fallback.resume_streams
    if resume_streams is None:  # on when any candidate can continue what any other started
        same_model = len({c.family for c in candidates}) == 1
        resume_streams = same_model and len(candidates) > 1 and any(c.resume != "none" for c in candidates)
    return CompiledRoute(
        name=name,
        backends=tuple(r.backends),
        slo=r.slo,
        objective=r.objective,
        when_infeasible=r.when_infeasible,
        fallback=r.fallback,
        exploration=r.exploration,
        description=r.description,
        budgets=r.budgets,
        waiting=r.waiting,
        admit_beyond_max_concurrency=r.admit_beyond_max_concurrency,
        resume_streams=resume_streams,
        aliases=tuple(r.aliases),
        replica_groups=replica_groups(tuple(r.backends), backends),
        private=r.private,
    )
