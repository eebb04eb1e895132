"""How the gateway reaches a backend, checked once at load: its URLs (as the wire client sends them),
its credential (fit for a header) and its TLS context (files read, key matched to its certificate).
Each problem names the field it is about, for the loader's file:line errors."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path

from gateway.policy import schema
from gateway.policy.urls import clean_url, header_value_problem


class ReachProblem(Exception):
    """What is wrong, and where below the backend (``loc``)."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc, self.message = loc, message


def clean(url: str, loc: tuple[str, ...]) -> str:
    """An upstream URL as the wire client sends it: IDN punycoded, path percent-encoded, query kept,
    no trailing slash on the path."""
    if not url.startswith(("http://", "https://")):
        raise ReachProblem(loc, "Input should be an http:// or https:// URL")
    try:
        cleaned = clean_url(url)
    except ValueError as exc:
        raise ReachProblem(loc, str(exc)) from None
    path, sep, query = cleaned.partition("?")
    return path.rstrip("/") + sep + query


def api_key(env_name: str | None, environ: Mapping[str, str]) -> str | None:
    """The credential from the environment, without the newline a Kubernetes secret usually ends
    with; one that would break (or inject into) the request head is a load error, not a 400 later."""
    if env_name is None:
        return None
    key = (environ.get(env_name) or "").strip()
    if not key:
        return None
    problem = header_value_problem(key)
    if problem is not None:
        raise ReachProblem(("api_key_env",), f"the value of environment variable {env_name} {problem}")
    return key


def tls_context(tls: schema.Tls, base_dir: Path) -> ssl.SSLContext:
    """The backend's TLS context, built (files read, key matched to certificate) once, at load."""

    def path(name: str, value: str) -> str:
        full = Path(value) if Path(value).is_absolute() else base_dir / value
        if not full.is_file():
            raise ReachProblem(("tls", name), f"{full} is not a readable file")
        return str(full)

    context = ssl.create_default_context()
    try:
        if tls.ca_file is not None:
            context = ssl.create_default_context(cafile=path("ca_file", tls.ca_file))
    except ssl.SSLError as exc:
        raise ReachProblem(("tls", "ca_file"), f"not a PEM CA bundle ({exc.reason or exc})") from None
    if tls.cert_file is not None:
        cert = path("cert_file", tls.cert_file)
        key = None if tls.key_file is None else path("key_file", tls.key_file)
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            message = f"cannot load the client certificate and key ({getattr(exc, 'reason', None) or exc})"
            raise ReachProblem(("tls", "cert_file"), message) from None
    return context
