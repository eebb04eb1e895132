"""``bench.wakeups``: a one-byte echo on loopback, its process pinned to each core in turn, really
answers every round trip, and the command prints both cases and the hand-off's cost."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.wakeups import measure

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")


def test_each_round_trip_is_answered_by_an_echo_on_either_core() -> None:
    for core in (0, 1):
        trips = measure(core, 50, 0.0)
        assert len(trips) == 50 and all(t > 0 for t in trips)
    assert len(measure(0, 3, 0.02)) == 3  # after a gap too


def test_the_command_prints_both_cases_and_the_difference() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.wakeups", "--count", "100", "--gaps", "3", "--gap-ms", "20"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cpuidle driver: ")
    assert lines[2].startswith("the client's core") and lines[3].startswith("the other core")
    assert lines[4].startswith("a hand-off to the other core costs ")
