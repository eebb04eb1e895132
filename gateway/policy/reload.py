"""The running policy and its hot reload: poll the file, install valid edits, keep the last good one.

Polling (stat, then a content digest) rather than inotify, so Kubernetes ConfigMap symlink swaps work.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gateway.policy.api_keys import read_keys_file, with_keys_digest
from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import Env, PolicyError, compile_policy_bytes, load_policy, read_policy_file

logger = logging.getLogger("gateway.policy")

PolicyListener = Callable[[CompiledPolicy], object]
# What one attempt produced (a new policy, why it was rejected, or nothing new), and the file's digest.
Outcome = tuple[CompiledPolicy | PolicyError | None, str | None]
StatKey = tuple[int, int, int, int] | None


class PolicyHolder:
    """Owns the current CompiledPolicy; requests read ``.current`` and never see a half-loaded one."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Iterable[PolicyListener] = (),
        environ: Env = None,
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._environ = environ
        self._listeners = list(on_change)
        self._current = load_policy(self.path, environ=environ)  # a bad policy must not start a server
        self._stat_key = self._stat_keys()
        self._rejected_digest: str | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None  # clock() reading of the last rejected reload
        self.reload_failures = 0
        self.reloads = 0

    @property
    def current(self) -> CompiledPolicy:
        return self._current

    def subscribe(self, listener: PolicyListener) -> None:
        """Call ``listener(policy)`` after each new policy is installed."""
        self._listeners.append(listener)

    def reload_now(self) -> bool:
        """Read the file now; True if a new valid policy was installed, False if rejected or unchanged."""
        return self.reload_checked() is True

    def reload_checked(self) -> bool | PolicyError:
        """Read the file now: True if a new valid policy was installed, False if the file holds the
        running policy already, or why it was rejected (the last good policy keeps serving)."""
        self._stat_key = self._stat_keys()
        outcome = self._attempt(retry_rejected=True)
        installed = self._install(outcome)
        return outcome[0] if isinstance(outcome[0], PolicyError) else installed

    async def watch(self, interval_s: float = 1.0) -> None:
        """Poll the file until cancelled, reloading when its content changes."""
        while True:
            await asyncio.sleep(interval_s)
            key = self._stat_keys()
            if key == self._stat_key:
                continue
            self._stat_key = key
            # Reading and compiling (maybe importing litellm) stays off the event loop.
            outcome = await asyncio.to_thread(self._attempt, retry_rejected=False)
            self._install(outcome)

    def _attempt(self, *, retry_rejected: bool) -> Outcome:
        try:
            data = read_policy_file(self.path)
        except PolicyError as exc:
            return exc, None
        # The keys file the running policy names: a policy edit that names another changes ``data``.
        keys_path = self._current.keys_file
        try:
            digest = with_keys_digest(hashlib.sha256(data).hexdigest(), keys_path, read_keys_file(keys_path))
        except PolicyError as exc:
            return exc, None
        if digest == self._current.digest or (digest == self._rejected_digest and not retry_rejected):
            return None, digest
        try:
            return compile_policy_bytes(data, str(self.path), environ=self._environ), digest
        except PolicyError as exc:
            return exc, digest

    def _install(self, outcome: Outcome) -> bool:
        result, digest = outcome
        if result is None:
            return False
        if isinstance(result, PolicyError):
            self._reject(result, digest)
            return False
        previous, self._current = self._current, result
        self._rejected_digest = None
        self.reloads += 1
        self.last_error = self.last_error_at = None
        logger.info(
            "policy reloaded from %s (sha256 %s -> %s): %d routes, %d backends",
            result.source,
            previous.digest[:12],
            result.digest[:12],
            len(result.routes),
            len(result.backends),
        )
        for warning in result.warnings:
            logger.warning("policy warning: %s", warning)
        for listener in self._listeners:
            try:
                listener(result)
            except Exception:  # one broken listener must not stop the others from hearing
                logger.exception("policy change listener %r failed", listener)
        return True

    def _stat_keys(self) -> tuple[StatKey, StatKey]:
        """The policy file's stat and its keys file's: either changing means read both again."""
        keys_file = self._current.keys_file
        return _stat_key(self.path), _stat_key(Path(keys_file)) if keys_file else None

    def _reject(self, error: PolicyError, digest: str | None) -> None:
        self._rejected_digest = digest
        self.reload_failures += 1
        self.last_error = str(error)
        self.last_error_at = self._clock()
        logger.error(
            "policy reload rejected; still serving sha256 %s from %s:\n%s",
            self._current.digest[:12],
            self._current.source,
            error,
        )


def _stat_key(path: Path) -> StatKey:
    """What changes when the file is edited or a ConfigMap swaps the symlink under it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev
