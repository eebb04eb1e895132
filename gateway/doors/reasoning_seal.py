"""Sealed reasoning for stateless clients: the Responses door hands a model's reasoning text back as
``encrypted_content`` (AES-GCM under the gateway's key) and reads it again when the client returns it.

The key is ``$GATEWAY_REASONING_KEY`` (any string; its SHA-256 is the AES key), so every replica and
worker that shares it reads every other's blobs. ``gateway serve`` sets one for its own process tree
when none is given (``ensure_key``) and says so: blobs then die with the process, which only costs the
model its earlier reasoning, never a failed request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import secrets
from collections.abc import Mapping, MutableMapping

KEY_ENV = "GATEWAY_REASONING_KEY"
# Bound into every blob: a blob sealed for another purpose under the same key does not open here.
_PURPOSE = b"gateway/responses/reasoning/v1"
_PREFIX = "gw1:"  # tells our blobs from OpenAI's at a glance (theirs are opaque base64 too)

logger = logging.getLogger("gateway")


class Sealer:
    __slots__ = ("_aead",)

    def __init__(self, secret: str) -> None:
        # Imported on the first sealed blob, not at start: cryptography's bindings are ~7 MB of every
        # gateway's memory, and most gateways never see a client that asks for encrypted reasoning.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(hashlib.sha256(secret.encode()).digest())

    def seal(self, text: str) -> str:
        nonce = secrets.token_bytes(12)
        sealed = self._aead.encrypt(nonce, text.encode(), _PURPOSE)
        return _PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, blob: object) -> str | None:
        """The text sealed in ``blob``; None for a blob this key did not seal or that was altered."""
        if not isinstance(blob, str) or not blob.startswith(_PREFIX):
            return None
        from cryptography.exceptions import InvalidTag  # loaded with AESGCM by __init__

        try:
            raw = base64.urlsafe_b64decode(blob[len(_PREFIX) :])
            return self._aead.decrypt(raw[:12], raw[12:], _PURPOSE).decode()
        except (InvalidTag, ValueError, binascii.Error, UnicodeDecodeError):
            return None


def sealer_from(environ: Mapping[str, str] = os.environ) -> Sealer | None:
    secret = environ.get(KEY_ENV)
    return Sealer(secret) if secret else None


def ensure_key(environ: MutableMapping[str, str] = os.environ) -> None:
    """Give this process (and the workers it starts) a reasoning key if the operator set none."""
    if environ.get(KEY_ENV):
        return
    environ[KEY_ENV] = secrets.token_urlsafe(32)
    logger.info(
        "%s is not set: sealed reasoning (/v1/responses encrypted_content) uses a key made for this"
        " process; set it, the same on every replica, to keep reasoning across restarts and replicas",
        KEY_ENV,
    )
