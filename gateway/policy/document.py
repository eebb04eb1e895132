"""A policy file as YAML with positions: every value knows its line and column, so each problem can
name ``file:line:col dotted.path``; pydantic's errors are mapped back to those places and worded for
people who edit YAML.
"""

from __future__ import annotations

import difflib
import math
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean

from gateway.policy import schema

Loc = tuple[str | int, ...]
Position = tuple[int, int]


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


# --- YAML with positions ---------------------------------------------------------------------------


def decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        column = exc.start - before.rfind(b"\n")
        raise PolicyError([Problem(source, before.count(b"\n") + 1, column, "", "not valid UTF-8")]) from None


def parse(text: str, source: str) -> Document:
    try:
        root = YAML(typ="rt").load(text)
    except RecursionError:  # ruamel parses nesting recursively: a few thousand "[" exhaust the stack
        raise PolicyError([Problem(source, 1, 1, "", "nested too deeply to be a policy")]) from None
    except DuplicateKeyError as exc:
        raise PolicyError([_duplicate_key_problem(exc, text, source)]) from None
    except MarkedYAMLError as exc:
        raise PolicyError([_syntax_problem(exc, source)]) from None
    except YAMLError as exc:
        raise PolicyError([Problem(source, 1, 1, "", str(exc))]) from None
    if not isinstance(root, CommentedMap):
        message = "expected a mapping with `backends:` and `routes:`"
        raise PolicyError([Problem(source, *_start(root), "", message)])
    return Document(root, source)


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
    doc = Document(lenient.load(text), source)
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


class Document:
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
