"""What the gateway's signal scraper would read from each backend model, at each backend's interval in
virtual time: load (vLLM/llama.cpp metrics, llama.cpp slots) and health, fed to ``LiveStats`` as the
real scraper feeds them (``measure/signals.py``, ``measure/health.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.measure.signals import LoadSignals
from gateway.measure.stats import LiveStats
from gateway.policy.compiled import CompiledPolicy
from gateway.simulate.backends import BackendModel
from gateway.simulate.timeline import Timeline


class SimScraper:
    def __init__(
        self,
        policy: CompiledPolicy,
        stats: LiveStats,
        timeline: Timeline,
        models: dict[str, BackendModel],
        running: Callable[[], bool],
    ) -> None:
        self._policy = policy
        self._stats = stats
        self._timeline = timeline
        self._models = models
        self._running = running  # False once the run's arrivals are over: stop scraping
        self._health: dict[str, tuple[bool, bool]] = {}

    def start(self) -> None:
        """Scrape every backend that has a signal or health URL, from the run's start."""
        for name, backend in self._policy.backends.items():
            signals = backend.signals
            if signals.metrics_url or signals.slots_url or signals.health_url:
                self._timeline.schedule(0.0, self._scrape, name, signals.interval_s)

    def _scrape(self, name: str, interval_s: float) -> None:
        model = self._models[name]
        signals = self._policy.backends[name].signals
        now = self._timeline.now
        if not model.down and (signals.metrics_url or signals.slots_url):
            slots = model.profile.max_running if signals.slots_url else None
            running = len(model.running)
            self._stats.update_signals(
                name,
                LoadSignals(
                    scraped_at=now,
                    running=float(running),
                    waiting=float(model.waiting),
                    slots_total=slots,
                    slots_busy=running if slots else None,
                ),
            )
        if signals.health_url:
            health = (model.healthy, model.booting)
            if self._health.get(name, (True, False)) != health:
                self._health[name] = health
                self._stats.set_health(name, *health)
        if self._running():
            self._timeline.schedule(now + interval_s, self._scrape, name, interval_s)
