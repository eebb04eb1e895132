"""The Phoenix screenshot in docs/observability.md, made again:
``.venv/bin/python -m tests.telemetry.screenshot docs/observability-phoenix.png``.

Phoenix, the three emulators and a gateway tracing to it: one stream that falls back once (the vLLM pool
answers 500 before any byte, the paid API answers) and one cut mid-answer and resumed on a second pool;
then headless Chromium opens the resumed stream's trace in Phoenix's UI and takes the picture."""

from __future__ import annotations

import base64
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gateway.emulator import create_emulator_app
from tests.conftest import PAID_KEY, TIME_SCALE, emulated_upstreams, running_gateway
from tests.servers import threaded_server
from tests.spend.chromium import chromium
from tests.telemetry.phoenix import SETUP, phoenix_python, running_phoenix
from tests.test_resume import policy, set_faults

FELL_BACK = "5bf92f3577b34da6a3ce929d0e0e4736"
RESUMED = "6bf92f3577b34da6a3ce929d0e0e4736"


def main(out: Path) -> None:
    python = phoenix_python()
    if python is None:
        raise SystemExit(f"Phoenix is not installed: run `bash {SETUP}`")
    os.environ["TEST_PAID_API_KEY"] = PAID_KEY
    with tempfile.TemporaryDirectory() as tmp, emulated_upstreams(TIME_SCALE) as up:
        work = Path(tmp)
        with (
            running_phoenix(python, work) as phoenix,
            threaded_server(create_emulator_app("b300-vllm", time_scale=TIME_SCALE, seed=7)) as pool_b,
        ):
            text = policy(up.vllm.url, pool_b.url, up.paid.url)
            (work / "policy.yaml").write_text(text + f"telemetry: {{otlp_endpoint: '{phoenix}'}}\n")
            with running_gateway(work / "policy.yaml") as gateway:
                for route, trace_id, faults in (
                    ("pool-then-api", FELL_BACK, {"error_rate": 1.0, "error_status": 500}),
                    (
                        "two-pools",
                        RESUMED,
                        {"reasoning_tokens": 3, "content_tokens": 20, "drop_after_chunks": 10},
                    ),
                ):
                    httpx.delete(up.vllm.url + "/emulator/faults")
                    set_faults(up.vllm.url, **faults)
                    body = {
                        "model": route,
                        "messages": [{"role": "user", "content": "Say hello"}],
                        "stream": True,
                    }
                    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
                    httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30)
            httpx.delete(up.vllm.url + "/emulator/faults")
            deadline = time.monotonic() + 60
            while (
                len(
                    httpx.get(f"{phoenix}/v1/projects/default/spans", params={"trace_id": RESUMED}).json()[
                        "data"
                    ]
                )
                < 3
            ):
                assert time.monotonic() < deadline, "Phoenix never showed the trace"
                time.sleep(0.2)
            project = base64.b64encode(b"Project:1").decode()
            with chromium(work / "chromium", width=1600, height=1000) as page:
                page.navigate(f"{phoenix}/projects/{project}/traces/{RESUMED}")
                page.wait_for(
                    "!!document.body && document.body.innerText.includes('chat two-pools')",
                    timeout=60,
                )
                time.sleep(3)  # its panels settle
                page.screenshot(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/observability-phoenix.png"))
