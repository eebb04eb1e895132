"""A serving process's interpreter settings, applied once the app has started: the cyclic collector's,
and how long another thread may hold the GIL while the event loop waits for it.

The collector: everything made until then (modules, the compiled policy, the runtime, ~60k objects)
lives as long as the process. Python's cyclic collector would still walk all of it on every full
collection: 30-40 ms in which no request moves and no streamed token goes out, the largest pause
measured on the request path. ``gc.freeze()`` takes those objects out of its sight.

A request's own objects are freed by reference counting the moment it settles: none of them is in a
reference cycle (``tests/test_no_cycles.py`` holds that), so collections find nothing to free and only
cost time. Python starts one every 700 container objects allocated net; objects of requests still in
flight count towards that, so at 64 requests in flight one ran every 7 requests. A first generation
ten times larger leaves the few real cycles (a failed connection's traceback) to be found a little
later and takes the collector off the request path (timed with ``gc.callbacks`` at 64 requests in
flight: ~0.5 s of collecting per 9k requests before, ~0.04 s after). Only ``gateway serve`` applies
this: a test process builds many apps, and frozen objects are never freed.
"""

from __future__ import annotations

import gc
import sys

FIRST_GENERATION_THRESHOLD = 7000  # Python's is 700; the older generations keep theirs (10, 10)
# Python's is 5 ms: how long the ledger writer's batch (one thread, same core) may keep the event loop
# waiting for the GIL. 0.5 ms took ~0.5 ms off the added latency's p99 at c=1 (interleaved runs, bench/).
SWITCH_INTERVAL_S = 0.0005


def tune_for_serving() -> None:
    """Both settings; only ``gateway serve`` (and each of its workers) applies them."""
    settle_heap()
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def settle_heap() -> None:
    """Collect what start-up left behind, freeze the rest, and make young collections rarer."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(FIRST_GENERATION_THRESHOLD, older, oldest)
