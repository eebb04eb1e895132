"""Fidelity: the same seeded ramp (three emulated pools, a small B300 pool that the ramp overloads)
through the real gateway over HTTP and through the simulator agrees on total cost within 5%, TTFT p95
within 10% and each backend's share within 5 points. Probes are off on both sides: with them on the
two part by more than these bounds (``tests/simulate/fidelity.py`` says by how much).
``python -m tests.simulate.fidelity 300`` runs the longer comparison.

The route explores nothing (``exploration: 0``): with exploration the pool is revisited at random
moments and a single run of either side scatters by several points of share (the simulator alone,
over seeds, spans 41-51% of B300 share on a 300 s ramp), so one run would compare noise with noise.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simulate.fidelity import through_gateway, through_simulator, workload

pytestmark = pytest.mark.slow
SHORT_RUN_S = 120.0  # emulated seconds: 30 s of real time at the time scale of the comparison


@pytest.mark.timeout(300)
def test_simulator_agrees_with_the_gateway_on_emulators(tmp_path: Path) -> None:
    work = workload(SHORT_RUN_S)
    real = through_gateway(work, tmp_path)
    simulated = through_simulator(work, tmp_path)
    assert real["requests"] == simulated["requests"] == len(work.requests)
    assert real["failures"] == simulated["failures"] == 0
    assert real["share"].get("paid-api", 0) > 0.1, "the ramp must overload the pool, or nothing is compared"
    assert simulated["total_cost_usd"] == pytest.approx(real["total_cost_usd"], rel=0.05)
    assert simulated["ttft_p95_s"] == pytest.approx(real["ttft_p95_s"], rel=0.10)
    for backend in ("b300-vllm", "paid-api", "a100-llamacpp"):
        gap = abs(simulated["share"].get(backend, 0.0) - real["share"].get(backend, 0.0))
        assert gap <= 0.05, (backend, real["share"], simulated["share"])
