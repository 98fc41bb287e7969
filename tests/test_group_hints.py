"""The "no such group" hint names the groups that exist (pure, no I/O)."""

from __future__ import annotations

from streamkit.group_hints import suggest

KNOWN = [("greetings", "printer"), ("greetings", "audit"), ("orders", "billing")]


def test_a_typo_in_the_group_names_the_closest_group() -> None:
    hint = suggest("greetings", "printr", KNOWN)
    assert hint == "stream 'greetings' has the group(s) 'audit', 'printer'; did you mean 'printer'?"


def test_an_unrelated_name_lists_the_groups_without_guessing() -> None:
    assert suggest("greetings", "zzz", KNOWN) == (
        "stream 'greetings' has the group(s) 'audit', 'printer'."
    )


def test_a_typo_in_the_stream_names_the_closest_stream() -> None:
    hint = suggest("greeting", "printer", KNOWN)
    assert (
        hint
        == "there is no stream 'greeting'; did you mean 'greetings' (group(s) 'audit', 'printer')?"
    )


def test_nothing_close_says_nothing() -> None:
    assert suggest("payments", "ledger", KNOWN) == ""
    assert suggest("greetings", "printer", []) == ""
