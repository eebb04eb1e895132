"""Load a policy file: YAML with positions, strict validation, then compilation to a CompiledPolicy.

Every problem names ``file:line:col dotted.path``. A policy that loads is ready to serve: prices are
evaluated, references resolved and credentials read here, never on a request.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean

from gateway.auth import ApiKey
from gateway.policy import schema
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute, PoolPrice, TokenPrices

Loc = tuple[str | int, ...]
Env = Mapping[str, str] | None  # where api_key_env is looked up; None means os.environ
Position = tuple[int, int]
PER_MTOK = 1e6
PROBE_TOKENS = 1_000_000


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a policy file, at a place a person can jump to."""

    file: str
    line: int  # 1-based; 0 when the file could not be read at all
    column: int  # 1-based
    path: str  # dotted path such as ``routes.kimi-k3.backends[1]``; empty for YAML syntax errors
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        return f"{where} {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class PolicyError(Exception):
    """A policy that must not be served; ``str()`` is one ``file:line:col path: message`` per line."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        # One problem per place: a NaN may also fail a bound, and the first message is the clearer one.
        unique = {(p.line, p.column, p.path): p for p in reversed(problems)}.values()
        self.problems = sorted(unique, key=lambda p: (p.line, p.column, p.path))
        super().__init__("\n".join(str(p) for p in self.problems))


class PolicyFileUnreadable(PolicyError):
    """The file itself could not be read (missing, a directory, no permission)."""


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
    return _compile(_decode(data, source), source, hashlib.sha256(data).hexdigest(), environ)


def compile_policy_text(text: str, source: str, *, environ: Env = None) -> CompiledPolicy:
    """Like load_policy for text already in memory; ``source`` is the name problems are reported under."""
    return _compile(text, source, hashlib.sha256(text.encode()).hexdigest(), environ)


def _compile(text: str, source: str, digest: str, environ: Env) -> CompiledPolicy:
    doc = _parse(text, source)
    try:
        raw = schema.PolicyFile.model_validate(doc.plain)
    except ValidationError as exc:
        raise PolicyError(
            doc.schema_problems(exc) + doc.nonfinite_problems() + _reference_problems(doc)
        ) from None
    problems = doc.nonfinite_problems() + _reference_problems(doc) + _key_problems(raw, doc)
    warnings = _unused_backend_warnings(raw, doc)
    backends: dict[str, CompiledBackend] = {}
    env = os.environ if environ is None else environ
    for name, backend in raw.backends.items():
        try:
            backends[name] = _compile_backend(name, backend, env)
        except _BackendProblem as exc:
            problems.append(doc.problem(("backends", name, *exc.loc), exc.message))
        if backend.api_key_env is not None and name in backends and backends[name].api_key is None:
            unset = f"environment variable {backend.api_key_env} is not set; requests go without a key"
            warnings.append(doc.problem(("backends", name, "api_key_env"), unset))
    if problems:
        raise PolicyError(problems)
    routes = {name: _compile_route(name, route) for name, route in raw.routes.items()}
    return CompiledPolicy(
        source=source,
        digest=digest,
        backends=types.MappingProxyType(backends),
        routes=types.MappingProxyType(routes),
        max_body_bytes=raw.server.max_body_bytes,
        warnings=tuple(str(w) for w in sorted(warnings, key=lambda p: (p.line, p.column))),
        ledger=raw.ledger,
        api_keys=types.MappingProxyType(_compile_keys(raw.auth)),
        key_budgets=types.MappingProxyType(
            {entry.name: entry.budgets for entry in raw.auth.keys if entry.budgets is not None}
        ),
        rate_limits=types.MappingProxyType(
            {entry.name: entry.rate_limit for entry in raw.auth.keys if entry.rate_limit is not None}
        ),
        store=raw.store,
    )


# --- YAML with positions ---------------------------------------------------------------------------


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        column = exc.start - before.rfind(b"\n")
        raise PolicyError([Problem(source, before.count(b"\n") + 1, column, "", "not valid UTF-8")]) from None


def _parse(text: str, source: str) -> _Document:
    try:
        root = YAML(typ="rt").load(text)
    except DuplicateKeyError as exc:
        raise PolicyError([_duplicate_key_problem(exc, text, source)]) from None
    except MarkedYAMLError as exc:
        raise PolicyError([_syntax_problem(exc, source)]) from None
    except YAMLError as exc:
        raise PolicyError([Problem(source, 1, 1, "", str(exc))]) from None
    if not isinstance(root, CommentedMap):
        message = "expected a mapping with `backends:` and `routes:`"
        raise PolicyError([Problem(source, *_start(root), "", message)])
    return _Document(root, source)


def _syntax_problem(exc: MarkedYAMLError, source: str) -> Problem:
    message = str(exc.problem or exc.context or "invalid YAML")
    if exc.problem and exc.context and exc.context_mark is not None:
        message += f" ({exc.context} started at line {exc.context_mark.line + 1})"
    return Problem(source, *_mark(exc.problem_mark or exc.context_mark), "", message)


def _duplicate_key_problem(exc: DuplicateKeyError, text: str, source: str) -> Problem:
    match = re.match(r'found duplicate key "(.*)" with value', str(exc.problem))
    key = match.group(1) if match else "?"
    lenient = YAML(typ="rt")
    lenient.allow_duplicate_keys = True
    doc = _Document(lenient.load(text), source)
    context = exc.context_mark
    mapping = doc.find_mapping(context.line, context.column) if context is not None else None
    (first_line, _), path = doc.locate((*mapping, key)) if mapping is not None else ((0, 0), key)
    first = f" (first defined at line {first_line})" if mapping is not None else ""
    return Problem(source, *_mark(exc.problem_mark), path, f"duplicate key{first}")


def _mark(mark: Any) -> Position:
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


def _start(node: Any) -> Position:
    if isinstance(node, CommentedMap | CommentedSeq) and node.lc.line is not None:
        return node.lc.line + 1, node.lc.col + 1
    return 1, 1


def _position(lookup: Callable[[Any], Any], key: Any, fallback: Position) -> Position:
    try:
        line, column = lookup(key)
    except (KeyError, IndexError, TypeError):  # e.g. keys brought in by a YAML merge (<<:)
        return fallback
    return int(line) + 1, int(column) + 1


def _scalar(value: Any) -> Any:
    """ruamel's scalar subclasses as the plain types strict pydantic expects."""
    if isinstance(value, bool | ScalarBoolean):
        return bool(value)
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


class _Document:
    """The YAML tree twice over: ruamel's nodes (which know positions) and plain data for pydantic."""

    def __init__(self, root: Any, source: str) -> None:
        self.root = root
        self.source = source
        self.nonfinite: list[Loc] = []
        self.plain = self._plain(root, ())

    def _plain(self, node: Any, loc: Loc) -> Any:
        if isinstance(node, Mapping):
            return {_scalar(k): self._plain(v, (*loc, _scalar(k))) for k, v in node.items()}
        if isinstance(node, list):
            return [self._plain(v, (*loc, i)) for i, v in enumerate(node)]
        value = _scalar(node)
        if isinstance(value, float) and not math.isfinite(value):
            self.nonfinite.append(loc)
        return value

    def locate(self, loc: Loc) -> tuple[Position, str]:
        """Position and dotted path of ``loc``; a missing key points at its parent."""
        node, position, path, found = self.root, _start(self.root), "", True
        for part in loc:
            if part == "[key]":  # pydantic's marker for an invalid mapping key: point at the key
                continue
            in_list = isinstance(part, int) and (isinstance(node, list) or not found)
            path += f"[{part}]" if in_list else f".{part}" if path else str(part)
            if found and isinstance(node, CommentedMap) and part in node:
                position, node = _position(node.lc.key, part, position), node[part]
            elif found and isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
                position, node = _position(node.lc.item, part, position), node[part]
            else:
                found = False
        return position, path

    def find_mapping(self, line: int, column: int) -> Loc | None:
        """The loc of the mapping that starts at 0-based (line, column)."""
        pending: list[tuple[Loc, Any]] = [((), self.root)]
        while pending:
            loc, node = pending.pop()
            if isinstance(node, CommentedMap):
                if (node.lc.line, node.lc.col) == (line, column):
                    return loc
                pending.extend(((*loc, k), v) for k, v in node.items())
            elif isinstance(node, CommentedSeq):
                pending.extend(((*loc, i), v) for i, v in enumerate(node))
        return None

    def problem(self, loc: Loc, message: str) -> Problem:
        (line, column), path = self.locate(loc)
        return Problem(self.source, line, column, path, message)

    def schema_problems(self, exc: ValidationError) -> list[Problem]:
        return [self.problem(err["loc"], _schema_message(err)) for err in exc.errors(include_url=False)]

    def nonfinite_problems(self) -> list[Problem]:
        return [self.problem(loc, "Input should be a finite number") for loc in self.nonfinite]


# --- schema messages -------------------------------------------------------------------------------


def _schema_message(err: Any) -> str:
    kind, loc = err["type"], err["loc"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        return f"unknown key{did_you_mean}; expected one of: {', '.join(allowed)}"
    if kind == "missing":
        return "required key is missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"Input should be a mapping, not {_yaml_type(err['input'])}"
    if kind == "list_type":
        return f"Input should be a list, not {_yaml_type(err['input'])}"
    return str(err["msg"]).removeprefix("Value error, ")


def _yaml_type(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }
    return "nothing (null)" if value is None else names.get(type(value), type(value).__name__)


def _allowed_keys(loc: Loc) -> list[str]:
    """The keys the model at ``loc`` accepts, walking the schema's type annotations."""
    current: Any = schema.PolicyFile
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        elif get_origin(current) in (dict, list):
            current = get_args(current)[-1]
        else:
            return []
    model = _unwrap(current)
    return sorted(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            options = [a for a in get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation


# --- checks beyond the schema, and compilation ------------------------------------------------------


class _BackendProblem(Exception):
    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(message)
        self.loc, self.message = loc, message


def _reference_problems(doc: _Document) -> list[Problem]:
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


def _unused_backend_warnings(policy: schema.PolicyFile, doc: _Document) -> list[Problem]:
    used = {name for route in policy.routes.values() for name in route.backends}
    return [doc.problem(("backends", n), "not used by any route") for n in policy.backends if n not in used]


def _compile_backend(name: str, backend: schema.Backend, environ: Mapping[str, str]) -> CompiledBackend:
    for field in ("metrics_url", "slots_url", "health_url"):
        url = getattr(backend.signals, field)
        if url is not None and not url.startswith(("http://", "https://")):
            raise _BackendProblem(("signals", field), "Input should be an http:// or https:// URL")
    token_prices, pool_price, price_source = _prices(backend.pricing)
    _probe_cost(token_prices, pool_price)
    return CompiledBackend(
        name=name,
        dialect=backend.dialect,
        base_url=backend.url.rstrip("/"),
        model=backend.model,
        token_prices=token_prices,
        pool_price=pool_price,
        thinking=backend.thinking,
        max_concurrency=backend.max_concurrency,
        context_window=backend.context_window,
        signals=backend.signals,
        timeouts=backend.timeouts,
        api_key=environ.get(backend.api_key_env) or None if backend.api_key_env else None,
        price_source=price_source,
    )


def _prices(pricing: schema.Pricing) -> tuple[TokenPrices | None, PoolPrice | None, str]:
    if pricing.per_token is not None:
        p = pricing.per_token
        cached = p.input_usd_per_mtok if p.cached_input_usd_per_mtok is None else p.cached_input_usd_per_mtok
        reasoning = p.output_usd_per_mtok if p.reasoning_usd_per_mtok is None else p.reasoning_usd_per_mtok
        prices = TokenPrices(
            input=p.input_usd_per_mtok / PER_MTOK,
            cached_input=cached / PER_MTOK,
            output=p.output_usd_per_mtok / PER_MTOK,
            reasoning=reasoning / PER_MTOK,
        )
        return prices, None, "per_token"
    if pricing.litellm is not None:
        return _litellm_prices(pricing.litellm.model), None, f"litellm:{pricing.litellm.model}"
    assert pricing.gpu_hours is not None  # the schema guarantees exactly one basis
    g = pricing.gpu_hours
    return None, PoolPrice(g.usd_per_hour, g.accounting, g.assumed_tokens_per_s), "gpu_hours"


def _litellm_prices(model: str) -> TokenPrices:
    """Per-token prices from litellm's bundled price map, read offline (litellm is imported only here)."""
    loc = ("pricing", "litellm", "model")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm  # heavy: imported only for policies that ask for it

    table: Mapping[str, Any] = litellm.model_cost
    entry = table.get(model) if model != "sample_spec" else None  # sample_spec documents the format
    if not isinstance(entry, Mapping):
        hint = difflib.get_close_matches(model, [k for k in table if k != "sample_spec"], n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise _BackendProblem(loc, f"unknown model {model!r} in litellm's price map{did_you_mean}")

    def cost(key: str, default: float | None) -> float:
        value = entry.get(key)
        if value is None and default is not None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise _BackendProblem(loc, f"litellm's price map has no usable {key} for {model!r}")
        return float(value)

    input_cost, output_cost = cost("input_cost_per_token", None), cost("output_cost_per_token", None)
    return TokenPrices(
        input=input_cost,
        cached_input=cost("cache_read_input_token_cost", input_cost),
        output=output_cost,
        reasoning=cost("output_cost_per_reasoning_token", output_cost),
    )


def _probe_cost(tokens: TokenPrices | None, pool: PoolPrice | None) -> None:
    """Price a dummy request once, so arithmetic that would overflow on a request fails at load."""
    if tokens is not None:
        cost = PROBE_TOKENS * (tokens.input + tokens.cached_input + tokens.output + tokens.reasoning)
        if not math.isfinite(cost):
            raise _BackendProblem(("pricing",), "price too large to compute a request's cost")
    if pool is not None and pool.assumed_tokens_per_s is not None:
        cost = PROBE_TOKENS * pool.usd_per_hour / (3600 * pool.assumed_tokens_per_s)
        if not math.isfinite(cost):
            loc = ("pricing", "gpu_hours", "assumed_tokens_per_s")
            raise _BackendProblem(loc, "too small to compute a cost per token from")


def _compile_route(name: str, r: schema.Route) -> CompiledRoute:
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
    )


def _compile_keys(auth: schema.Auth) -> dict[str, ApiKey]:
    return {
        entry.sha256: ApiKey(
            name=entry.name, digest=entry.sha256, routes=frozenset(entry.routes), admin=entry.admin
        )
        for entry in auth.keys
    }


def _key_problems(raw: schema.PolicyFile, doc: _Document) -> list[Problem]:
    """Keys must name routes that exist, and neither a name nor a digest may appear twice."""
    problems: list[Problem] = []
    names: set[str] = set()
    digests: set[str] = set()
    for i, entry in enumerate(raw.auth.keys):
        for j, route in enumerate(entry.routes):
            if route != "*" and route not in raw.routes:
                known = ", ".join(raw.routes)
                problems.append(
                    doc.problem(("auth", "keys", i, "routes", j), f"no route '{route}' (routes: {known})")
                )
        if entry.name in names:
            problems.append(
                doc.problem(("auth", "keys", i, "name"), f"key name '{entry.name}' is used twice")
            )
        if entry.sha256 in digests:
            problems.append(doc.problem(("auth", "keys", i, "sha256"), "the same key digest appears twice"))
        names.add(entry.name)
        digests.add(entry.sha256)
    return problems
