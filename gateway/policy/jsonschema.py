"""The policy file's JSON Schema, generated from the pydantic models, for editors' completion and checks.

``python -m gateway.policy.jsonschema`` rewrites ``policies/policy.schema.json``; a test keeps it current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gateway.policy.schema import PolicyFile

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "policies" / "policy.schema.json"
REGENERATE = "python -m gateway.policy.jsonschema"


def policy_json_schema() -> dict[str, Any]:
    generated = PolicyFile.model_json_schema()
    generated.update(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Gateway policy file",
            "description": "Backends, routes and prices for the cost-aware LLM gateway (policies/README.md)",
        }
    )
    return generated


def render_policy_json_schema() -> str:
    """The committed file's exact text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    target = Path(argv[0]) if argv else SCHEMA_FILE
    target.write_text(render_policy_json_schema(), encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
