"""The gateway's synthetic probes in virtual time: the same plan (``measure/probe_plan.py``) decides which
backend is due, each probe is a one-token job on the backend model, and its answer goes through
``LiveStats.probe_finished`` as the real one does, so a simulation notices a recovery when the gateway
would. A paid API's probes come out of the policy's probe budget and count in the run's API spend, as
the gateway records them (the ledger's ``probes`` table); a pool's cost nothing beyond its hours.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gateway.measure.probe_plan import PROBE_PROMPT_TOKENS, DueProbe, ProbePlan
from gateway.measure.recovery import RecoveryBar, recovery_bar
from gateway.measure.stats import AttemptTicket, ProbeView
from gateway.money.costs import attempt_cost
from gateway.policy.compiled import CompiledPolicy
from gateway.simulate.backends import BackendModel, Job
from gateway.simulate.timeline import Timeline
from gateway.simulate.watched_stats import WatchedStats
from gateway.values.observation import Attempt, AttemptStatus, Usage

# Virtual seconds between looks at what is due: the real prober looks every 50 ms of real time.
TICK_S = 0.25


@dataclass(slots=True)
class ProbeFlight:
    """What hangs on a probe's job: why it was sent and its attempt."""

    due: DueProbe
    ticket: AttemptTicket
    attempt: Attempt
    job: Job | None = None


class SimProber:
    def __init__(
        self,
        policy: CompiledPolicy,
        stats: WatchedStats,
        timeline: Timeline,
        models: dict[str, BackendModel],
        running: Callable[[], bool],
    ) -> None:
        self._policy = policy
        self._stats = stats
        self._timeline = timeline
        self._models = models
        self._running = running  # False once the run's arrivals are over: stop looking
        self._plan = ProbePlan()
        self._plan.set_backends(policy.backends, policy.tuning.probes.on_start)
        self._inflight: dict[str, ProbeFlight] = {}
        # recovery_bar is a function of (backend, p95, decode speed): each look reuses what it found.
        self._bars: dict[tuple[str, float | None, float | None], RecoveryBar] = {}
        self._bar_values: dict[RecoveryBar, RecoveryBar] = {}
        self._bar_set: dict[str, RecoveryBar] = {}
        # Each backend's look key (``_keys``) at the last look, and until when the plan would choose
        # nothing on the same: a look in between with the same keys is skipped, as it would do
        # nothing. Most looks of a busy day are (a probe is for backends that traffic avoids).
        self._names = tuple(policy.backends)
        self._looked: list[tuple[object, ...]] = []
        self._quiet_until = -math.inf
        self._wakes_at = -math.inf  # the next time a circuit turns half-open or a pause ends
        self._seen: list[tuple[str, ProbeView]] = []  # what the last read read, by backend
        self.sent: Counter[str] = Counter()  # probes sent, by backend
        self.spent_usd: dict[str, float] = {}  # what the paid APIs' probes cost, by backend

    def start(self) -> None:
        # Even with probes off: the bars it keeps let users' answers end a slow spell, as in the gateway.
        self._timeline.schedule(0.0, self._tick)

    def _tick(self) -> None:
        now = self._timeline.now
        stats = self._stats
        # Nothing is read when nothing was fed about any backend since the last read (``touched``),
        # no circuit turns half-open or pause ends by time (``_wakes_at``) and nothing is due by time
        # before ``_quiet_until``. Else the fields the plan reads are (of the backends fed, while
        # nothing is due by time: the others' read the same), and the look is still skipped when
        # nothing its outcome depends on changed since the last one (``_keys``).
        quiet = now + 1e-9 < self._quiet_until and now < self._wakes_at
        if not (quiet and not stats.touched):
            read = stats.read_touched
            if quiet:
                touched = stats.touched
                seen = [read(name) if name in touched else view for name, view in self._seen]
            else:
                seen = [read(name) for name in self._names]
            if not (quiet and self._keys(seen) == self._looked):
                if quiet:  # the look reads every backend afresh (signals may have gone stale)
                    seen = [read(name) for name in self._names]
                self._look(now, seen)
            else:
                self._seen = list(zip(self._names, seen, strict=True))
            self._wakes_at = min(stats.wakes_at(name) for name in self._names)
        if self._running():
            self._timeline.schedule(now + TICK_S, self._tick)

    def _bar(self, name: str, view: ProbeView) -> RecoveryBar:
        key = (name, view.ttft_p95_s, view.decode_tokens_per_s)
        bar = self._bars.get(key)
        if bar is None:
            if len(self._bars) >= 4096:  # p95s are sample values: bound what a long run keeps
                self._bars.clear()
            bar = recovery_bar(name, self._policy.routes.values(), key[1], key[2])
            # One object per bar value: a look is skipped while each backend's bar is the one set.
            bar = self._bars[key] = self._bar_values.setdefault(bar, bar)
        return bar

    def _keys(self, seen: list[ProbeView]) -> list[tuple[object, ...]]:
        """Of each backend, what a look's outcome may depend on before ``_quiet_until`` (see
        ``ProbePlan.quiet_until``): its bar, health, circuit, pause, whether anything is in flight on
        it, when it was last probed while its circuit is open, and its last user's sample while idle.
        (How many are in flight, its signals and spend matter only once it is due by time.)"""
        keys: list[tuple[object, ...]] = []
        bar_of = self._stats.recovery_bar_of
        for name, view in zip(self._names, seen, strict=True):
            idle = not view.inflight
            circuit = view.circuit
            bar = self._bar(name, view)
            keys.append((
                bar,
                bar_of(name) is bar,
                view.healthy,
                view.booting,
                idle,
                view.paused_until is None,
                circuit,
                view.accepts_requests,
                view.last_probe_at if circuit == "open" else None,
                view.last_user_sample_at if idle else None,
            ))  # fmt: skip
        return keys

    def _look(self, now: float, seen: list[ProbeView]) -> None:
        # The same look as the gateway's Prober (ProbePlan.bars, then ProbePlan.due), on the fields of
        # the views that the plan reads (``LiveStats.probe_view``: the same values, no view built).
        needed = self._policy.tuning.probes.recovery_probes
        bar_of = self._stats.recovery_bar_of
        looked = dict(zip(self._names, seen, strict=True))
        for name, view in looked.items():
            bar = self._bar(name, view)
            self._bar_set[name] = bar
            if bar_of(name) is not bar:  # setting the same bar again changes nothing
                self._stats.set_recovery_bar(name, bar, needed)
        # The plan reads what was just read (at the same instant nothing changed it: ``due`` sends
        # nothing before it returns); after a probe went out, each backend is read afresh.
        sent = False
        for due in self._plan.due(self._policy, looked.__getitem__, now, self._inflight, self._bar_set):
            self._send(due, now)
            sent = True
        if sent:
            read = self._stats.read_touched
            seen = [read(name) for name in self._names]
            looked = dict(zip(self._names, seen, strict=True))
        self._looked = self._keys(seen)
        self._seen = list(zip(self._names, seen, strict=True))
        self._quiet_until = self._plan.quiet_until(self._policy, looked.__getitem__, now, self._inflight)

    def _send(self, due: DueProbe, now: float) -> None:
        name = due.backend.name
        ticket = self._stats.attempt_started(name, probe=True)
        flight = ProbeFlight(due, ticket, Attempt(backend=name, started_at=now, probe=True))
        job = flight.job = Job(PROBE_PROMPT_TOKENS, due.max_tokens, flight)
        self._inflight[name] = flight
        self.sent[name] += 1
        self._models[name].submit(job)
        self._timeline.schedule(now + due.backend.timeouts.first_byte_s, self._timeout, flight, job)

    def _timeout(self, flight: ProbeFlight, job: Job) -> None:
        if flight.job is job and job.state in ("waiting", "prefill"):
            self._models[flight.attempt.backend].cancel(job)
            self._end(flight, "timeout")

    # What the engine hands over from the backend models' reports on probe jobs.

    def finished(self, job: Job) -> None:
        flight: ProbeFlight = job.owner
        if flight.job is not job:
            return
        now = self._timeline.now
        attempt = flight.attempt
        first = job.first_token_at if job.first_token_at is not None else now
        attempt.ttft_s = first - attempt.started_at
        attempt.decode_s = now - first
        attempt.token_chunks = job.output_tokens
        attempt.usage = usage = Usage(PROBE_PROMPT_TOKENS, job.output_tokens, 0)
        name = attempt.backend
        backend = self._policy.backends[name]
        if backend.token_prices is not None:
            aggregate, prefill = self._stats.cost_speeds(name)  # the view's, without building one
            usd = attempt_cost(backend, usage, aggregate, prefill).usd
            self._plan.paid(now, usd)
            self.spent_usd[name] = self.spent_usd.get(name, 0.0) + usd
        self._end(flight, "ok")

    def failed(self, job: Job, http_status: int | None) -> None:
        flight: ProbeFlight = job.owner
        if flight.job is job:
            flight.attempt.http_status = http_status
            self._end(flight, "upstream_error")

    def _end(self, flight: ProbeFlight, status: AttemptStatus) -> None:
        flight.job = None
        attempt = flight.attempt
        attempt.status = status
        attempt.finished_at = self._timeline.now
        settings = self._policy.tuning.probes
        name = attempt.backend
        self._stats.probe_finished(
            flight.ticket, attempt, settings.recovery_probes, settings.recovery_ratio, flight.due.bar
        )
        del self._inflight[name]
        self._plan.finished(name, self._stats.recovering(name))
        self._quiet_until = -math.inf  # the plan may want it again at once (a recovery to confirm)
