"""Samples the gateway with py-spy while the load generator saturates it, and names the hot spots:
functions by their own (self) samples, and our own code's functions by inclusive samples."""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.loadgen import closed_loop
from bench.suite import Way

FRAME_RE = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def short_frame(frame: str) -> str:
    """``func (/long/path/site-packages/pkg/mod.py:12)`` -> ``pkg/mod.py:func``."""
    match = FRAME_RE.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match["file"]
    for anchor in ("site-packages/", "/gateway/", "/lib/python3"):
        at = path.rfind(anchor)
        if at >= 0:
            path = (
                path[at + len(anchor) :] if anchor != "/gateway/" else "gateway/" + path[at + len(anchor) :]
            )
            break
    return f"{path}:{match['func']}"


def hot_spots(raw: str, top: int = 15) -> dict[str, Any]:
    """From py-spy's collapsed stacks (``a;b;c 12`` per line): self and own-code inclusive shares."""
    self_counts: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    innermost: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [short_frame(f) for f in stack.split(";")]
        total += count
        self_counts[frames[-1]] += count
        packages[_package(frames[-1])] += count
        own = [f for f in frames if f.startswith("gateway/")]
        if own:
            # Our innermost function pays for itself and for every library call it makes.
            innermost[own[-1]] += count
        for frame in set(frames):
            if frame.startswith("gateway/"):
                ours[frame] += count
    if not total:
        return {"samples": 0, "top_self": [], "top_ours": [], "by_package": [], "top_innermost": []}
    return {
        "samples": total,
        "by_package": [(p, c / total) for p, c in packages.most_common(top)],
        "top_self": [(f, c / total) for f, c in self_counts.most_common(top)],
        "top_ours": [(f, c / total) for f, c in ours.most_common(top)],
        "top_innermost": [(f, c / total) for f, c in innermost.most_common(top)],
    }


def _package(frame: str) -> str:
    """``aiohttp/client.py:f`` -> ``aiohttp``; the event loop's own (C) time shows as ``asyncio``."""
    path = frame.split(":", 1)[0]
    head = path.split("/", 1)[0]
    return head.removesuffix(".py") if head else path


async def profile(way: Way, stream: bool, seconds: float, out_dir: Path) -> dict[str, Any] | None:
    exe = py_spy()
    if exe is None:
        return None
    kind = "stream" if stream else "nonstream"
    raw_path = out_dir / f"profile-{way.name}-{kind}.txt"
    argv = [
        "taskset", "-c", "1", exe, "record", "--pid", str(way.proc.pid), "--rate", "500",
        "--duration", str(int(seconds)), "--format", "raw", "--nonblocking", "--output", str(raw_path),
    ]  # fmt: skip
    spy = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    await asyncio.sleep(0.5)
    load = asyncio.create_task(closed_loop(way.target(stream), 64, seconds))
    _, err = await spy.communicate()
    await load
    if not raw_path.exists():
        return {"error": err.decode(errors="replace")[-400:]}
    return {"file": str(raw_path), **hot_spots(raw_path.read_text())}
