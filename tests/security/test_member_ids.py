"""Member ids are public (READ); the incarnation that lets a member leave is not."""

from __future__ import annotations


def test_member_ids_differ_per_start_and_show_nothing_of_the_incarnation() -> None:
    """The incarnation is what lets a member leave; member ids are shown to any
    READ caller, so no 8-digit run of the incarnation may appear in them."""
    from streamkit.consumer.member import new_incarnation
    from streamkit.settings import StreamKitSettings

    settings = StreamKitSettings(member_id_base="host")
    starts = [new_incarnation() for _ in range(200)]
    prefixes = [settings.member_id_prefix(inc) for inc in starts]
    assert len(set(prefixes)) == len(starts)
    for incarnation, prefix in zip(starts, prefixes, strict=True):
        assert prefix.startswith("host-") and len(prefix) == len("host-") + 8
        runs = {incarnation[i : i + 8] for i in range(len(incarnation) - 7)}
        assert not any(run in prefix for run in runs), (incarnation, prefix)
