"""``core.rollback.observe``: when a coordinator process must open a correction round."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamkit_server.core.rollback import Seen, observe

versions = st.integers(min_value=0, max_value=1_000)


@given(revision=versions, version=versions, seen_revision=versions, seen_version=versions)
def test_another_server_is_a_regression_whatever_the_revisions(
    revision: int, version: int, seen_revision: int, seen_version: int
) -> None:
    seen = Seen(lifecycle=1, revision=seen_revision, metadata_version=seen_version)
    got = observe(seen, 1, revision, version, locked=True, server_changed=True)
    # The round must cover every version this process saw, not only Redis'.
    assert got.regressed_from_version == max(version, seen_version)
    assert got.seen == Seen(1, revision, version)


@given(revision=versions, version=versions)
def test_a_process_that_saw_nothing_still_reports_a_server_change(
    revision: int, version: int
) -> None:
    # The process that never saw the lost grant is exactly the one that needs this.
    for seen in (None, Seen(lifecycle=7, revision=revision + 1, metadata_version=version + 1)):
        got = observe(seen, 1, revision, version, locked=True, server_changed=True)
        assert got.regressed_from_version == version


def test_a_read_only_load_does_not_consume_the_report() -> None:
    seen = Seen(lifecycle=1, revision=5, metadata_version=3)
    got = observe(seen, 1, 5, 3, locked=False, server_changed=True)
    assert got.regressed_from_version is None and got.seen == seen
    # The next locked load still reports it.
    assert observe(got.seen, 1, 5, 3, locked=True, server_changed=True).regressed_from_version == 3


@given(revision=versions, seen_revision=versions)
def test_same_server_reports_only_a_lower_revision(revision: int, seen_revision: int) -> None:
    seen = Seen(lifecycle=1, revision=seen_revision, metadata_version=4)
    got = observe(seen, 1, revision, 2, locked=True)
    assert (got.regressed_from_version is not None) == (revision < seen_revision)
