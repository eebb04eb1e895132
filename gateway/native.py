"""The hot modules compiled to C with mypyc, and the guard that never lets a stale build run.

The gateway is pure Python and runs as such. ``python -m gateway.build_native build`` compiles ``MODULES``
(the simulator's event loop and backend models, the live stats and the routing decision, which both
the simulator and every live request run, the request path's synchronous modules and a traced
request's tracer, record, span writer and exporter) with mypyc into extension modules beside their
sources; Python's importer prefers an extension module to a ``.py`` of the same name, so they are used
from then on. The code is ``mypy --strict`` already, and mypyc keeps its semantics: the simulator's
report is the same to the last digit either way (tests/simulate, docs/performance.md).

A build records the hash of each source it compiled (``native.json``). At import of ``gateway``,
``guard()`` compares them with the sources now: if any differs (an edit, a checkout, another
interpreter) or ``GATEWAY_NATIVE=off`` is set, every compiled module is imported from its ``.py``
instead: all or none, because the compiled modules call each other inside one shared library.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import orjson

PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST = PACKAGE_DIR / "native.json"
GROUP = "gateway.native"  # the shared library every compiled module's shim loads: gateway/native__mypyc.*

# What a simulated request and a live decision spend their CPU in, the request path's synchronous
# modules (the stream meter, the OpenAI door, the usage readers, the ledger's rows), and a traced
# request's tracer, record, span writer and exporter (docs/performance.md has the profiles).
# A class defined here cannot be subclassed by Python code (tests included), and its methods cannot be
# patched: tests that look inside one (line tracing, patched methods) are marked ``pure_python``.
MODULES = (
    "gateway.backends.chat_shape",
    "gateway.doors.openai",
    "gateway.measure.backend_stats",
    "gateway.measure.decayed",
    "gateway.measure.health",
    "gateway.measure.meter",
    "gateway.measure.transcript",
    "gateway.measure.probe_plan",
    "gateway.measure.recovery",
    "gateway.measure.signals",
    "gateway.measure.stats",
    "gateway.emulator.profiles",
    "gateway.ledger.rejection",
    "gateway.ledger.rows",
    "gateway.money.costs",
    "gateway.policy.compiled",
    "gateway.policy.decide",
    "gateway.policy.evaluate",
    "gateway.request.answer_headers",
    "gateway.request.privacy",
    "gateway.request.refusals",
    "gateway.simulate.backends",
    "gateway.simulate.engine",
    "gateway.simulate.probing",
    "gateway.simulate.resuming",
    "gateway.simulate.scraping",
    "gateway.simulate.timeline",
    "gateway.simulate.waiting",
    "gateway.simulate.watched_stats",
    "gateway.telemetry.context",
    "gateway.telemetry.encode",
    "gateway.telemetry.exporter",
    "gateway.telemetry.otlp",
    "gateway.telemetry.record",
    "gateway.telemetry.tracer",
    "gateway.values.dialect",
    "gateway.values.observation",
)


def source_of(module: str) -> Path:
    return PACKAGE_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py")


def source_hashes() -> dict[str, str]:
    return {m: hashlib.blake2b(source_of(m).read_bytes(), digest_size=16).hexdigest() for m in MODULES}


def built_for() -> str:
    return f"{sys.implementation.cache_tag}-{sys.platform}"


def _read_manifest() -> dict[str, object] | None:
    try:
        manifest = orjson.loads(MANIFEST.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return manifest if isinstance(manifest, dict) else None


class _FromSource(importlib.abc.MetaPathFinder):
    """Imports the compiled modules from their ``.py`` files, ahead of the extension modules."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, source_of(fullname))


# One line for ``gateway --version`` and the benchmarks: which code is running.
state = "pure Python (not built: python -m gateway.build_native build)"


def guard() -> None:
    """Run the compiled modules only if every one was built from the sources here, for this Python."""
    global state
    manifest = _read_manifest()
    if os.environ.get("GATEWAY_NATIVE", "").lower() in ("0", "off", "false", "no"):
        state = "pure Python (GATEWAY_NATIVE=off)"
    elif manifest is None:
        pass  # nothing built, or a build under way or failed: its extension modules may be half there
    elif manifest.get("built_for") != built_for():
        state = f"pure Python (compiled for {manifest.get('built_for')}, not this interpreter)"
    elif manifest.get("sources") != source_hashes():
        state = "pure Python (sources changed since the build: python -m gateway.build_native build)"
    else:
        state = f"compiled: {len(MODULES)} modules (mypyc)"
        return
    # The modules built, too: a build from an older list may hold one this list no longer names.
    built = manifest.get("sources") if manifest is not None else None
    names = frozenset(MODULES) | (frozenset(built) if isinstance(built, dict) else frozenset())
    sys.meta_path.insert(0, _FromSource(names))
