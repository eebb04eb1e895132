"""The OpenAI doors, /v1/chat/completions and /v1/completions: the upstream dialect itself, so requests
are validated and passed on with only the model replaced, and answers go back as they came but for
their ``model``, which names the route the client asked for."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from gateway.doors import ClientRequest
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    MalformedBody,
    ModelNotFound,
    error_event,
    error_response,
)
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.values.dialect import estimate_tokens, prompt_chars

if TYPE_CHECKING:
    from gateway.doors import Answering, StreamTranslator


class OpenAIDoor:
    """``name`` "chat" requires ``messages``, "completions" requires ``prompt``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.upstream_path = "/chat/completions" if name == "chat" else "/completions"

    def parse(
        self, body: bytes, policy: CompiledPolicy, chars_per_token: float, caller: str = ""
    ) -> ClientRequest:

        payload = json_object(body)
        route = route_of(payload.get("model"), policy)
        value = payload.get("messages" if self.name == "chat" else "prompt")
        if self.name == "chat" and (not isinstance(value, list) or not value):
            raise InvalidRequest("'messages' is required and must be a non-empty array", param="messages")
        if self.name == "completions" and not isinstance(value, (str, list)):
            raise InvalidRequest("'prompt' is required and must be a string or an array", param="prompt")
        stream = payload.get("stream", False)
        if not isinstance(stream, bool):
            raise InvalidRequest("'stream' must be a boolean", param="stream")
        options = payload.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise InvalidRequest("'stream_options' must be an object", param="stream_options")
        max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise InvalidRequest("'max_tokens' must be a positive integer", param="max_tokens")
        check_numbers(payload)
        chars = prompt_chars(payload)
        return ClientRequest(
            payload=payload,
            route=route,
            stream=stream,
            wants_usage=bool(stream and options and options.get("include_usage")),
            prompt_chars=chars,
            prompt_tokens=estimate_tokens(chars, chars_per_token),
            max_tokens=max_tokens,
        )

    def render_answer(self, raw: bytes, exchange: Answering) -> bytes:
        """The upstream's bytes as they came, answering with the model the client asked for."""
        renamer = model_renamer(exchange)
        return raw if renamer is None else renamer.translate(raw)

    def stream_translator(self, exchange: Answering) -> StreamTranslator | None:
        return model_renamer(exchange)

    def error_response(self, error: GatewayError) -> Response:
        return error_response(error)


class ModelRenamer:
    """Answers carry the route the client named as their ``model`` (the backend's own model name goes in
    the ``x-gateway-upstream-model`` header): one bytes replace per chunk, no parsing. An escaped quote
    inside generated text cannot match, so only the JSON field changes."""

    __slots__ = ("_new", "_old", "_pairs")

    def __init__(self, upstream: str, route: str) -> None:
        old, new = orjson.dumps(upstream), orjson.dumps(route)
        self._pairs = ((b'"model":' + old, b'"model":' + new), (b'"model": ' + old, b'"model": ' + new))
        # The spelling this upstream uses, learnt from its first chunk that names a model; b"" when
        # it names another one (an alias of its own): nothing to rename, and no search per chunk.
        self._old: bytes | None = None
        self._new = b""

    def translate(self, events: bytes) -> bytes:
        old = self._old
        if old is not None:
            return events.replace(old, self._new) if old else events
        for old, new in self._pairs:
            if old in events:
                self._old, self._new = old, new
                return events.replace(old, new)
        if b'"model"' in events:
            self._old = b""
        return events

    def error(self, message: str, code: str) -> bytes:
        return error_event(message, code)


def model_renamer(exchange: Answering) -> ModelRenamer | None:
    observation = exchange.observation
    if observation is None or observation.backend is None:
        return None
    upstream = exchange.policy.backends[observation.backend].model
    return None if upstream == observation.route else ModelRenamer(upstream, observation.route)


def translated_request(
    body: bytes,
    policy: CompiledPolicy,
    chars_per_token: float,
    to_chat: Callable[[dict[str, Any]], dict[str, Any]],
) -> ClientRequest:
    """A request in another door's dialect, as the chat payload ``to_chat`` makes of it. Such doors
    always want the usage chunk: their own closing events carry it."""

    request = json_object(body)
    route = route_of(request.get("model"), policy)
    payload = to_chat(request)
    check_numbers(payload)
    chars = prompt_chars(payload)
    return ClientRequest(
        payload=payload,
        route=route,
        stream=payload["stream"],
        wants_usage=True,
        prompt_chars=chars,
        prompt_tokens=estimate_tokens(chars, chars_per_token),
        max_tokens=payload.get("max_tokens"),
    )


# The sampling numbers a chat or completions request may carry, with the range OpenAI documents: a
# value outside it is the client's mistake, told as a 400 here rather than left to each upstream (some
# answer it with a 500, which would read as the backend failing and open its circuit).
NUMBER_RANGES: dict[str, tuple[float, float, bool]] = {  # field: (least, most, whole numbers only)
    "temperature": (0.0, 2.0, False),
    "top_p": (0.0, 1.0, False),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
    "n": (1, 128, True),
    "top_logprobs": (0, 20, True),
    "seed": (-(2**63), 2**63 - 1, True),
}


def check_numbers(payload: dict[str, Any]) -> None:
    """InvalidRequest naming the first sampling number that is not a number in its range."""
    for name, (least, most, whole) in NUMBER_RANGES.items():
        value = payload.get(name)
        if value is None:
            continue
        number = isinstance(value, int) or (isinstance(value, float) and not whole)
        if isinstance(value, bool) or not number or not least <= value <= most:
            kind = "an integer" if whole else "a number"
            span = f"{int(least)} to {int(most)}" if whole else f"{least:g} to {most:g}"
            raise InvalidRequest(f"'{name}' must be {kind} from {span}", param=name)


def json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object; InvalidRequest in OpenAI's words otherwise."""
    if not body:
        raise MalformedBody("request body is empty; expected a JSON object")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedBody(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise MalformedBody("request body must be a JSON object")
    if body.count(b"[") + body.count(b"{") > MAX_NESTING:  # a memchr-speed look before the real one
        check_nesting(payload)
    return payload


# orjson reads 1,024 levels of nesting but writes only 255: a body between the two would parse, then
# fail as it is sent upstream. Refused here instead, as the client's error.
MAX_NESTING = 255


def check_nesting(payload: dict[str, Any]) -> None:
    try:
        orjson.dumps(payload)
    except TypeError:
        raise InvalidRequest(
            f"request body nests arrays and objects deeper than {MAX_NESTING} levels"
        ) from None


def route_of(model: object, policy: CompiledPolicy) -> CompiledRoute:
    """The route a request's ``model`` names (or one of its aliases); 404 listing the known ones when it
    names none."""
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    route = policy.route_for(model)
    if route is None:
        known = ", ".join(sorted(policy.routes))
        raise ModelNotFound(f"The model '{model[:200]}' does not exist. Known models: {known}")
    return route


CHAT = OpenAIDoor("chat")
COMPLETIONS = OpenAIDoor("completions")
