"""The gateway's version: the installed package's (pyproject.toml's ``version``), for ``--version``,
``/health`` and the ``gateway_build_info`` metric."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def gateway_version() -> str:
    try:
        return version("gateway")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
