"""Sealed reasoning for stateless clients: the Responses door hands a model's reasoning text back as
``encrypted_content`` (AES-GCM) and reads it again when the client returns it.

A blob is bound to what it was sealed for: its associated data names the purpose, the caller's API
key (the SHA-256 the policy stores; none where the policy has no keys) and the time it was sealed, which
travels in clear beside the nonce. It opens only in a request made with the same key, and only for
``MAX_AGE_S``: a blob copied into another key's request, or replayed past its age, is left out like an
altered one (the model loses that reasoning; the request goes on, with a note).

The AES key is derived with HKDF-SHA256 from ``$GATEWAY_REASONING_KEY``, which must be a random secret
of at least ``MIN_SECRET_CHARS`` characters: the summary sealed beside the blob is a known plaintext, so
a guessable secret could be searched offline. Every replica and worker that shares it reads every
other's blobs. Rotation: set the new secret and move the old one to ``$GATEWAY_REASONING_KEY_PREVIOUS``;
blobs sealed under either open, new ones are sealed under the new; after ``MAX_AGE_S`` no blob of the
old secret is still valid and the previous variable can go. ``gateway serve`` refuses to start with a
short secret, and sets one for its own process tree when none is given (``ensure_key``), saying so:
blobs then die with the process, which costs the model its earlier reasoning, never a failed request.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

KEY_ENV = "GATEWAY_REASONING_KEY"
PREVIOUS_KEY_ENV = "GATEWAY_REASONING_KEY_PREVIOUS"
MIN_SECRET_CHARS = 32  # what secrets.token_urlsafe(24) gives: 144 bits and more
MAX_AGE_S = 7 * 24 * 3600  # a Codex session resumed within a week keeps its reasoning
SKEW_S = 300  # a blob sealed by a replica whose clock runs ahead still opens
# Bound into every blob: a blob sealed for another purpose under the same key does not open here.
_PURPOSE = b"gateway/responses/reasoning/v2"
_PREFIX = "gw2:"  # tells our blobs from OpenAI's at a glance (theirs are opaque base64 too)
_NONCE_BYTES = 12
_STAMP_BYTES = 8  # the second it was sealed, big-endian

logger = logging.getLogger("gateway")


class ShortSecret(ValueError):
    """A reasoning secret too short to stand an offline search."""


def check_secret(name: str, secret: str) -> None:
    if len(secret) < MIN_SECRET_CHARS:
        raise ShortSecret(
            f"{name} is {len(secret)} characters; it must be a random secret of at least"
            f" {MIN_SECRET_CHARS} (for example: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )


class Keyring:
    """The AES-GCM keys derived from the current secret and, during a rotation, the previous one."""

    __slots__ = ("_aeads",)

    def __init__(self, secret: str, previous: str | None = None) -> None:
        check_secret(KEY_ENV, secret)
        if previous:
            check_secret(PREVIOUS_KEY_ENV, previous)
        # Imported on the first sealed blob, not at start: cryptography's bindings are ~7 MB of every
        # gateway's memory, and most gateways never see a client that asks for encrypted reasoning.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aeads = tuple(AESGCM(_derive(s)) for s in (secret, previous) if s)

    def for_caller(self, caller: str, clock: Callable[[], float] = time.time) -> Sealer:
        return Sealer(self._aeads, caller, clock)


def _derive(secret: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_PURPOSE).derive(secret.encode())


class Sealer:
    """Seals and opens blobs for one caller (its API key's digest; ``""`` where the policy has none)."""

    __slots__ = ("_aeads", "_caller", "_clock")

    def __init__(self, aeads: tuple[Any, ...], caller: str, clock: Callable[[], float]) -> None:
        self._aeads = aeads
        self._caller = caller.encode()
        self._clock = clock

    def _associated(self, stamp: bytes) -> bytes:
        return b"%b\0%b\0%b" % (_PURPOSE, self._caller, stamp)

    def seal(self, text: str) -> str:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        stamp = int(self._clock()).to_bytes(_STAMP_BYTES, "big")
        sealed = self._aeads[0].encrypt(nonce, text.encode(), self._associated(stamp))
        return _PREFIX + base64.urlsafe_b64encode(nonce + stamp + sealed).decode()

    def open(self, blob: object) -> str | None:
        """The text sealed in ``blob``; None for a blob not sealed for this caller under a key of the
        ring, past its age, or altered."""
        if not isinstance(blob, str) or not blob.startswith(_PREFIX):
            return None
        from cryptography.exceptions import InvalidTag  # loaded with AESGCM by the keyring

        try:
            raw = base64.urlsafe_b64decode(blob[len(_PREFIX) :])
        except (ValueError, binascii.Error):
            return None
        head = _NONCE_BYTES + _STAMP_BYTES
        nonce, stamp, sealed = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:head], raw[head:]
        if len(stamp) < _STAMP_BYTES:
            return None
        age = self._clock() - int.from_bytes(stamp, "big")
        if not -SKEW_S <= age <= MAX_AGE_S:  # checked before decrypting, bound by the tag after
            return None
        for aead in self._aeads:
            try:
                return str(aead.decrypt(nonce, sealed, self._associated(stamp)).decode())
            except (InvalidTag, ValueError, UnicodeDecodeError):
                continue
        return None


def sealer_from(caller: str, environ: Mapping[str, str] = os.environ) -> Sealer | None:
    """The sealer of ``caller``'s requests under the configured secrets; None when none is set (or it
    is too short: ``gateway serve`` refuses to start then, an app built otherwise seals nothing)."""
    keyring = _keyring(environ.get(KEY_ENV) or "", environ.get(PREVIOUS_KEY_ENV) or "")
    return None if keyring is None else keyring.for_caller(caller)


@functools.lru_cache(maxsize=4)
def _keyring(secret: str, previous: str) -> Keyring | None:
    """Derived once per secret, not per request (HKDF and the AES key schedule)."""
    if not secret:
        return None
    try:
        return Keyring(secret, previous or None)
    except ShortSecret as exc:
        logger.error("sealed reasoning is off: %s", exc)
        return None


def ensure_key(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Give this process (and the workers it starts) a reasoning key if the operator set none; what is
    wrong with the secrets set (too short), for ``gateway serve`` to refuse to start with."""
    try:
        for name in (KEY_ENV, PREVIOUS_KEY_ENV):
            if environ.get(name):
                check_secret(name, environ[name])
    except ShortSecret as exc:
        return str(exc)
    if environ.get(KEY_ENV):
        return None
    environ[KEY_ENV] = secrets.token_urlsafe(32)
    logger.info(
        "%s is not set: sealed reasoning (/v1/responses encrypted_content) uses a key made for this"
        " process; set it, the same on every replica, to keep reasoning across restarts and replicas",
        KEY_ENV,
    )
    return None
