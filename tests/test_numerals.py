"""``ascii_uint``: what text counts as a whole number where anyone can write the text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamkit.numerals import ascii_uint


@given(st.text(max_size=12), st.one_of(st.none(), st.integers(0, 10**6)))
def test_never_raises_and_agrees_with_plain_ascii_digits(text: str, maximum: int | None) -> None:
    value = ascii_uint(text, maximum)
    plain = text != "" and all("0" <= c <= "9" for c in text)
    if not plain or (maximum is not None and int(text) > maximum):
        assert value is None
    else:
        assert value == int(text)


def test_unicode_digits_are_not_numbers() -> None:
    assert ascii_uint("\u00b9") is None  # isdigit() but int() raises
    assert ascii_uint("\u0663") is None  # int() reads 3
    assert ascii_uint("-1") is None and ascii_uint("+1") is None and ascii_uint(" 1") is None
    assert ascii_uint("65535", 65_535) == 65_535 and ascii_uint("65536", 65_535) is None
