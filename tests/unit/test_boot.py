"""Reading a health answer over a backend's boot, per dialect (docs/contracts/*.yaml, section health)."""

from __future__ import annotations

import pytest

from gateway.backends.base import Fetched
from gateway.measure.boot import read_health

REFUSED = Fetched(None, error="ConnectError: cannot connect")
TIMED_OUT = Fetched(None, error="TimeoutError: no answer in 5s")


def reading(dialect: str, reply: Fetched, *, ready_once: bool = False, waited_s: float = 0.0,
            expected_boot_s: float | None = None) -> tuple[bool, bool]:  # fmt: skip
    read = read_health(
        dialect, reply, ready_once=ready_once, waited_s=waited_s, expected_boot_s=expected_boot_s
    )
    return read.healthy, read.booting


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_a_refused_connection_before_the_first_200_is_a_boot(dialect: str) -> None:
    """vLLM and SGLang do not listen while they load: a 27-minute boot is booting, not down."""
    assert reading(dialect, REFUSED, waited_s=27 * 60) == (False, True)
    assert reading(dialect, Fetched(200)) == (True, False)
    # Once it was up, a refusal is a fall (a crash, a stop), not a boot.
    assert reading(dialect, REFUSED, ready_once=True) == (False, False)
    # A timeout is not a refusal: something answers the SYN and then nothing.
    assert reading(dialect, TIMED_OUT) == (False, False)


def test_vllm_503_is_a_dead_engine_never_a_boot() -> None:
    assert reading("vllm", Fetched(503)) == (False, False)
    assert reading("vllm", Fetched(503), ready_once=True) == (False, False)


def test_sglang_503_is_warming_up_before_the_first_200_and_a_failure_after() -> None:
    assert reading("sglang", Fetched(503)) == (False, True)
    assert reading("sglang", Fetched(503), ready_once=True) == (False, False)


def test_llamacpp_503_is_loading_and_a_refusal_is_down() -> None:
    assert reading("llamacpp", Fetched(503)) == (False, True)
    assert reading("llamacpp", REFUSED) == (False, False)


def test_a_boot_past_the_policy_expected_boot_time_reads_down() -> None:
    assert reading("vllm", REFUSED, waited_s=1799, expected_boot_s=1800) == (False, True)
    read = read_health("vllm", REFUSED, ready_once=False, waited_s=1801, expected_boot_s=1800)
    assert (read.healthy, read.booting) == (False, False) and "1800" in read.why
