"""The inbox sample's transaction: an id applies its effect once, whatever repeats."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from samples.inbox.app import apply_once, connect


def test_an_id_applies_once_and_a_failed_transaction_leaves_nothing(tmp_path: Path) -> None:
    db = connect(str(tmp_path / "inbox.sqlite3"))
    assert apply_once(db, "pay-1", "alice", 500)
    assert not apply_once(db, "pay-1", "alice", 500)  # redelivered: skipped
    assert apply_once(db, "pay-2", "alice", 250)
    assert db.execute("SELECT cents FROM balances").fetchone() == (750,)
    db.execute("CREATE TRIGGER no_bob BEFORE INSERT ON balances WHEN NEW.account = 'bob' "
               "BEGIN SELECT RAISE(ABORT, 'refused'); END")  # fmt: skip
    with pytest.raises(sqlite3.IntegrityError):
        apply_once(db, "pay-3", "bob", 100)
    # The effect failed, so the inbox row went with it: a retry can apply it.
    assert db.execute("SELECT count(*) FROM inbox WHERE idempotency_id = 'pay-3'").fetchone() == (
        0,
    )
