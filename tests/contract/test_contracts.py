"""The engine contracts, entry for entry, against every emulator profile of the dialect and, for
llama.cpp, the real llama-server: an emulator can no longer drift from the engine it stands for."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.contract.checks import CHECKS
from tests.contract.contracts import CITATION, SECTIONS, Entry, checked_entries, contract, dialects, entries
from tests.contract.targets import REAL_LLAMA, Running, emulator, real_llama, targets_of


def _cases() -> list[Any]:
    cases = []
    for entry in checked_entries():
        assert entry.check is not None
        for target in targets_of(entry.dialect):
            if target == REAL_LLAMA and entry.check.get("real") == "skip":
                continue
            marks = [pytest.mark.slow] if target == REAL_LLAMA else []
            cases.append(pytest.param(entry, target, id=f"{entry.name}@{target}", marks=marks))
    return cases


@pytest.fixture(scope="session")
def shared_llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.real.conftest import skip_without_setup, start_llama_server, wait_for_boot

    skip_without_setup()
    log_path = tmp_path_factory.mktemp("contract-llama") / "server.log"
    process, url = start_llama_server(log_path)
    try:
        wait_for_boot(process, url, log_path)
        yield url
    finally:
        process.stop()


@pytest.mark.parametrize(("entry", "target"), _cases())
def test_the_target_keeps_the_contract(
    entry: Entry, target: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    assert entry.check is not None
    check = {key: value for key, value in entry.check.items() if key not in ("kind", "real")}

    def start(**options: Any) -> contextlib.AbstractContextManager[Running]:
        if target != REAL_LLAMA:
            return emulator(target, **options)
        if options.get("cold_boot") or options.get("engine_args") is not None:
            from tests.real.conftest import skip_without_setup

            skip_without_setup()
            return real_llama(tmp_path, shared=None, **options)  # a server of its own
        if options.get("context_tokens") is not None:
            options = {**options, "context_tokens": None}  # the real server keeps its own context
        return real_llama(tmp_path, shared=request.getfixturevalue("shared_llama"), **options)

    CHECKS[entry.check["kind"]](start, check)


@pytest.mark.parametrize("dialect", dialects())
def test_every_entry_names_its_source_and_version(dialect: str) -> None:
    document = contract(dialect)
    assert document["pinned"] and document["source"] and document["supported"]
    assert set(document) - {
        "engine",
        "dialect",
        "pinned",
        "source",
        "supported",
        "emulator_profiles",
        "real",
    } <= set(SECTIONS)
    found = entries(dialect)
    assert found, f"{dialect}: no entries"
    ids = [entry.id for entry in found]
    assert len(ids) == len(set(ids)), "ids repeat"
    for entry in found:
        assert entry.id.startswith(entry.section + "."), f"{entry.id}: ids are section.name"
        assert entry.says.strip() and entry.cite, entry.id
        for citation in entry.cite:
            assert CITATION.match(citation), f"{entry.id}: {citation!r} is not path:line in the engine's tree"
        if entry.check is not None:
            assert entry.check["kind"] in CHECKS, f"{entry.id}: unknown check {entry.check['kind']}"
    assert set(document["emulator_profiles"]) == set(targets_of(document["dialect"])) - {REAL_LLAMA}
    # A release version (vLLM, SGLang) or the full commit (llama.cpp has no releases the sdist names).
    assert re.fullmatch(r"\d+\.\d+\.\d+|[0-9a-f]{40}", document["pinned"]), document["pinned"]


# Where the engines' sources lie unpacked at the pinned versions (as /tmp/engines/README says); the
# citations are checked against them when they are there.
SOURCES = Path(os.environ.get("ENGINE_SOURCES", "/tmp/engines"))
TREES = {"vllm": "vllm/src/vllm", "sglang": "sglang/src/sglang", "llama.cpp": "llamacpp/src"}


@pytest.mark.parametrize("dialect", dialects())
def test_every_citation_is_a_line_of_the_pinned_source(dialect: str) -> None:
    if not SOURCES.is_dir():
        pytest.skip(f"the engines' sources are not unpacked at {SOURCES} (ENGINE_SOURCES)")
    missing = []
    for entry in entries(dialect):
        for citation in entry.cite:
            package, _, rest = citation.partition("/")
            path, _, lines = rest.rpartition(":")
            last = int(lines.split("-")[-1])
            source = SOURCES / TREES[package] / path
            if not source.is_file():
                missing.append(f"{entry.id}: {citation} (no such file)")
            elif last > len(source.read_text(errors="replace").splitlines()):
                missing.append(f"{entry.id}: {citation} (past the file's end)")
    assert not missing, "\n".join(missing)
