"""Inbox sample: exactly-once effects in a database outside Redis (SQLite).

A Redis script cannot reach another database, so ``msg.effects`` cannot
cover it.  The inbox pattern does: the message's idempotency id goes into an
``inbox`` table with a primary key *in the same database transaction* as the
effect.  A redelivered or republished message finds its id there, the insert
conflicts, the effect is skipped, and the entry is acked again.  The ack may
still be lost (a crash after the commit): the next delivery is then skipped
by the inbox, which is the point.

``msg.idempotency_id`` is the publisher's id (``publish(...,
idempotency_id=...)``) or the entry id.  The listener is declared
``idempotent=True`` too: Redis markers skip most duplicates before the
handler runs, so the database sees fewer of them; the inbox is what makes
the effect exactly-once.

Run it (a private Redis and coordinator; Ctrl-C stops everything)::

    INBOX_DB=/tmp/inbox.sqlite3 streamkit dev samples.inbox.app:app
"""

from __future__ import annotations

import os
import sqlite3
from decimal import Decimal

from streamkit import Message, StreamKit

PAYMENTS = "payments"
LEDGER = "ledger"

SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (idempotency_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, cents INTEGER NOT NULL);
"""


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)  # transactions spelled out below
    db.executescript(SCHEMA)
    return db


def apply_once(db: sqlite3.Connection, idempotency_id: str, account: str, cents: int) -> bool:
    """Credit ``cents`` to ``account`` unless ``idempotency_id`` was applied; True if applied.

    The inbox row and the effect commit together or not at all.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        inserted = db.execute(
            "INSERT INTO inbox (idempotency_id) VALUES (?) ON CONFLICT DO NOTHING",
            (idempotency_id,),
        ).rowcount
        if inserted:
            db.execute(
                "INSERT INTO balances (account, cents) VALUES (?, ?) "
                "ON CONFLICT (account) DO UPDATE SET cents = cents + excluded.cents",
                (account, cents),
            )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return bool(inserted)


app = StreamKit()
app.stream(PAYMENTS, shards=4)
_db: sqlite3.Connection | None = None


@app.stream_listener(stream_prefix=PAYMENTS, group=LEDGER, idempotent=True, auto_ack=True)
def credit(msg: Message) -> None:
    # A plain def runs in a worker thread: sqlite3 blocks.  One connection per
    # process, used by one handler at a time (ordered, concurrency 1).
    global _db
    if _db is None:
        _db = connect(os.environ.get("INBOX_DB", "inbox.sqlite3"))
    cents = int(Decimal(msg.fields["amount"]) * 100)
    apply_once(_db, msg.idempotency_id, msg.fields["account"], cents)
