"""The soak's verdict on hand-made records: each check fails when it must."""

from __future__ import annotations

from pathlib import Path

from .checks import DataLoss, FaultSpan, judge, parse

MS = 1_000_000


def _write(tmp_path: Path, publisher: list[str], *consumers: list[str]) -> list[Path]:
    (tmp_path / "publisher.rec").write_text("\n".join(publisher) + "\n")
    paths = []
    for i, lines in enumerate(consumers):
        path = tmp_path / f"c{i}.rec"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def _judge(tmp_path: Path, publisher: list[str], *consumers: list[str], **kw: object):  # type: ignore[no-untyped-def]
    paths = _write(tmp_path, publisher, *consumers)
    died = kw.pop("died", {})
    records = parse(tmp_path / "publisher.rec", paths, died, 10_000 * MS)  # type: ignore[arg-type]
    return judge(records, kw.get("losses", []), kw.get("faults", []))  # type: ignore[arg-type]


PUB = ["P 0 k0 0 1-0 100", "P 1 k0 0 2-0 200"]


def test_a_clean_handoff_passes(tmp_path: Path) -> None:
    a = ["B 0 a 1 10 100 900", "E 0 a 1 10 150 1", "H 0 k0 0 a 1 10 150 160 1-0 0"]
    b = ["B 0 b 2 20 300 900", "E 0 b 2 20 350 1", "H 1 k0 0 b 2 20 350 360 2-0 0"]
    v = _judge(tmp_path, PUB, a, b)
    assert v.ok and v.published == v.handled == 2 and not v.duplicates


def test_two_readers_at_once_is_an_overlap(tmp_path: Path) -> None:
    a = ["B 0 a 1 10 100 900", "E 0 a 1 10 400 1", "H 0 k0 0 a 1 10 400 410 1-0 0"]
    b = ["B 0 b 2 20 300 900", "E 0 b 2 20 350 1", "H 1 k0 0 b 2 20 350 360 2-0 0"]
    v = _judge(tmp_path, PUB, a, b)
    assert len(v.overlaps) == 1 and not v.ok


def test_a_late_end_is_held_only_until_the_lease(tmp_path: Path) -> None:
    # a was paused mid-read: it records the end at 5000, but its lease ended at 250.
    a = ["B 0 a 1 10 100 250", "E 0 a 1 10 5000 0"]
    b = [
        "B 0 b 2 20 300 900",
        "E 0 b 2 20 350 2",
        "H 0 k0 0 b 2 20 350 360 1-0 1",
        "H 1 k0 0 b 2 20 360 370 2-0 0",
    ]
    v = _judge(tmp_path, PUB, a, b)
    assert v.ok and v.late_ends == 1
    # ... but a lease that lasted into b's read is an overlap.
    a[0] = "B 0 a 1 10 100 301"
    assert len(_judge(tmp_path, PUB, a, b).overlaps) == 1


def test_a_read_after_the_lease_ended_fails(tmp_path: Path) -> None:
    a = ["B 0 a 1 10 300 250", "E 0 a 1 10 310 0"]
    v = _judge(tmp_path, PUB, a)
    assert len(v.reads_without_lease) == 1 and not v.ok


def test_a_killed_reader_holds_until_its_death(tmp_path: Path) -> None:
    a = ["B 0 a 1 10 100 900"]  # no end: SIGKILLed at 320
    b = ["B 0 b 2 20 300 900", "E 0 b 2 20 350 0"]
    assert len(_judge(tmp_path, [], a, b, died={10: 320}).overlaps) == 1
    assert not _judge(tmp_path, [], a, b, died={10: 290}).overlaps


def test_an_unhandled_entry_is_lost_unless_redis_dropped_it(tmp_path: Path) -> None:
    a = ["H 0 k0 0 a 1 10 150 160 1-0 0"]
    v = _judge(tmp_path, PUB, a)
    assert v.lost == [1] and not v.ok
    v = _judge(tmp_path, PUB, a, losses=[DataLoss("failover", 250, {1})])
    assert v.ok and v.dropped_by_redis == {"failover": 1}


def test_duplicates_are_counted_with_their_reason(tmp_path: Path) -> None:
    a = ["H 0 k0 0 a 1 10 150 160 1-0 0", "H 0 k0 0 a 1 10 170 180 1-0 0"]
    b = ["H 0 k0 0 b 2 20 300 310 1-0 1", "H 1 k0 0 b 2 20 320 330 2-0 0"]
    v = _judge(tmp_path, PUB, a, b)
    assert v.ok
    assert v.duplicates == {
        "read as new again (Redis rolled back)": 1,
        "claimed from another reader": 1,
    }


def test_per_key_order_within_a_run(tmp_path: Path) -> None:
    a = ["H 1 k0 0 a 1 10 150 160 2-0 0", "H 0 k0 0 a 1 10 170 180 1-0 0"]
    v = _judge(tmp_path, PUB, a)
    assert len(v.order_violations) == 1 and not v.ok


def test_reconvergence_is_the_catch_up_after_the_heal(tmp_path: Path) -> None:
    a = ["H 0 k0 0 a 1 10 150 160 1-0 0", "H 1 k0 0 a 1 10 2000 2100 2-0 0"]
    v = _judge(tmp_path, PUB, a, faults=[FaultSpan("consumer-kill", 0, 300)])
    assert v.last_reconvergence_s == (2100 - 300) / 1e9


def test_refused_publishes_are_counted_apart_and_never_lost(tmp_path: Path) -> None:
    # seq 1 refused twice (Redis full), then published; seq 2 refused and the
    # run ended before a retry: nothing was accepted, so nothing is lost.
    pub = ["P 0 k0 0 1-0 100", "R 1 k0 150", "R 1 k0 180", "P 1 k0 0 2-0 200", "R 2 k0 250"]
    a = ["H 0 k0 0 a 1 10 150 160 1-0 0", "H 1 k0 0 a 1 10 250 260 2-0 0"]
    v = _judge(tmp_path, pub, a)
    assert v.ok and v.published == v.handled == 2
    assert (v.refused, v.refused_seqs, v.refused_never_published) == (3, 2, 1)


def test_an_entry_appended_despite_a_refusal_is_a_second_entry(tmp_path: Path) -> None:
    # A refusal that did append (it must not): the retry's entry is another one.
    pub = ["R 0 k0 90", "P 0 k0 0 2-0 100"]
    a = ["H 0 k0 0 a 1 10 150 160 1-0 0", "H 0 k0 0 a 1 10 170 180 2-0 0"]
    v = _judge(tmp_path, pub, a)
    assert v.duplicates["publisher retry (two entries)"] == 1
