"""Headless Chromium driven over the DevTools protocol (a websocket), enough to load a page, wait for
something to show up in it, read values out and take a screenshot. No browser downloads, no Selenium."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self._socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:  # events arrive in between; only our answer matters
            message = json.loads(self._socket.recv(timeout=30))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, equals: Any = True, timeout: float = 20.0) -> Any:
        """Poll ``expression`` until its value equals ``equals`` (True: until it is truthy)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if bool(value) if equals is True else value == equals:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"page shows {value!r}, not {equals!r}: {expression}")
            time.sleep(0.1)

    def navigate(self, url: str) -> None:
        self.send("Page.enable")
        self.send("Page.navigate", url=url)

    def screenshot(self, path: Path) -> bytes:
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        return data


@contextmanager
def chromium(profile_dir: Path, width: int = 1400, height: int = 1500) -> Iterator[Page]:
    """A fresh headless Chromium with its own profile; stopped by its process id afterwards."""
    binary = chromium_path()
    assert binary is not None
    profile_dir.mkdir(parents=True, exist_ok=True)
    args = [binary, *FLAGS, f"--user-data-dir={profile_dir}", f"--window-size={width},{height}"]
    args.append("about:blank")
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024) as socket:
            yield Page(socket)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
