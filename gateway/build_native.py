"""``python -m gateway.build_native``: compile the modules ``gateway.native.MODULES`` lists with mypyc,
in place, and record what was compiled (``gateway/native.json``) so that a stale build never runs.

Needs mypy (the dev extra) and a C compiler; takes minutes (one type check of the whole package, then
gcc over one generated file). ``clean`` removes the compiled files; ``status`` says what runs.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from gateway import native
from gateway.native import GROUP, MANIFEST, MODULES, PACKAGE_DIR, source_hashes, source_of


def build(log: Path) -> None:
    """Compile ``MODULES`` in place (mypyc then the C compiler), writing their output to ``log``."""
    from mypyc.build import mypycify  # the dev extra's mypy; imported only to build
    from setuptools import Distribution

    root = PACKAGE_DIR.parent
    sources = source_hashes()  # before compiling: an edit made meanwhile leaves the build stale
    clean()  # a loaded extension module overwritten in place can crash the process that holds it
    cwd = Path.cwd()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        os.chdir(root)  # mypyc reads pyproject.toml's [tool.mypy], as `mypy` does
        try:
            extensions = mypycify(
                [str(source_of(m).relative_to(root)) for m in MODULES],
                opt_level="3",
                group_name=GROUP,
                target_dir="build/native",
            )
            distribution = Distribution({"name": "gateway-native", "ext_modules": extensions})
            command = distribution.get_command_obj("build_ext")
            command.inplace = True  # beside their sources, where the importer prefers them
            command.build_temp = "build/native/temp"
            distribution.run_command("build_ext")
        finally:
            os.chdir(cwd)
    MANIFEST.write_bytes(
        orjson.dumps({"built_for": native.built_for(), "sources": sources}, option=orjson.OPT_INDENT_2)
    )


def clean() -> int:
    """Remove every extension module under gateway/ (all of them are builds of ours, of this list or an
    older one) and the manifest; returns how many files went."""
    removed = 0
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for path in PACKAGE_DIR.rglob(f"*{suffix}"):
            path.unlink()
            removed += 1
    MANIFEST.unlink(missing_ok=True)
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gateway.build_native",
        description="Compile the gateway's hot modules with mypyc (needs mypy and a C compiler).",
    )
    parser.add_argument("action", choices=("build", "clean", "status"))
    args = parser.parse_args(argv)
    if args.action == "status":
        print(native.state)
        return 0
    if args.action == "clean":
        print(f"removed {clean()} compiled files; the gateway runs its .py files")
        return 0
    log = PACKAGE_DIR.parent / "build" / "native" / "build.log"
    print(f"compiling {len(MODULES)} modules with mypyc (type check, C, gcc: minutes); output in {log}")
    started = time.monotonic()
    try:
        build(log)
    except (Exception, SystemExit) as failed:  # mypyc reports type errors and gcc failures as SystemExit
        tail = log.read_text(errors="replace").splitlines()[-30:] if log.exists() else []
        print("\n".join(tail), file=sys.stderr)
        print(
            f"gateway.native: the build failed ({failed!r}); the gateway runs its .py files", file=sys.stderr
        )
        return 1
    print(f"compiled {len(MODULES)} modules in {time.monotonic() - started:.0f} s; they run from now on")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
