"""The build script, the demo and the tests agree on which llama-server they mean and how it runs; fast,
no server needed (the real-model tests next to this file need one)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.demo import LLAMA_SERVER_VERSION, real_server_command

REAL = Path(__file__).parent


def test_the_build_script_builds_the_version_the_demo_and_tests_look_for() -> None:
    script = (REAL / "build_llama_server.sh").read_text()
    assert f"\nLLAMA_CPP_PYTHON_VERSION={LLAMA_SERVER_VERSION}\n" in script
    assert 'BIN="$CACHE/bin/llama-server-$LLAMA_CPP_PYTHON_VERSION"' in script
    # Portable: a native build dies with "Illegal instruction" on another CPU.
    for flag in (
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        "-DLLAMA_CURL=OFF",
    ):
        assert re.search(rf"(^|\s){re.escape(flag)}(\s|$)", script, re.M), flag
    assert "--target llama-server" in script
    assert "bash tests/real/build_llama_server.sh" in (REAL / "setup_llamacpp.sh").read_text()


def test_the_server_runs_with_what_the_gateway_reads() -> None:
    command = real_server_command(Path("/bin/llama-server"), Path("/m.gguf"), "gemma", 8104, slots=2)
    assert command[0] == "/bin/llama-server"
    # /metrics is off unless asked; /slots is on by default, asked anyway so an older build serves it too.
    assert {"--metrics", "--slots"} <= set(command)

    def value(flag: str) -> str:
        return command[command.index(flag) + 1]

    assert value("--host") == "127.0.0.1" and value("--port") == "8104" and value("--alias") == "gemma"
    # --ctx-size is shared by the slots: 2048 tokens each.
    assert value("--parallel") == "2" and value("--ctx-size") == "4096"
    # An HTTP thread per slot, two for llama-server's own default margin and three for the scraper.
    assert value("--threads-http") == "7"
    # The GGUF has no chat template of its own: the built-in gemma one, which Jinja mode would not take.
    assert value("--chat-template") == "gemma" and "--no-jinja" in command
