"""What the translating doors' tests compare with: the emulator's deterministic answer and the ledger."""

from __future__ import annotations

import sqlite3

from tests.conftest import Gateway
from tests.spend.conftest import ledger_rows
from tests.test_exchange import eventually

# The b300-vllm profile: 64 reasoning tokens "think<i> ", then 32 answer tokens "word<j> ".
THINKING = "".join(f"think{i} " for i in range(64))
ANSWER = "".join(f"word{j} " for j in range(32))


def ledger_row(gateway: Gateway, request_id: str) -> sqlite3.Row:
    """The request's ledger row, once the writer (about once a second) has written it."""
    ledger = gateway.policy_path.parent / "ledger.sqlite3"
    where = ("request_id = ?", (request_id,))
    eventually(lambda: ledger.exists() and len(ledger_rows(ledger, *where)) == 1, 10, "the ledger row")
    (row,) = ledger_rows(ledger, *where)
    return row


def settled_request_id(gateway: Gateway, nth: int) -> str:
    """The id of the ``nth`` request this gateway settled (a stream settles just after its last byte)."""
    eventually(lambda: len(gateway.runtime.recent) >= nth, 10, f"request {nth} settled")
    return gateway.runtime.recent[nth - 1].request_id
