"""A column sent as one joined text is refused, not sent, when the server could not split it
back into the same values (the server's side: tests/integration/sql/test_payauth_authorize.py)."""

from __future__ import annotations

import pytest

from service.adapters.pg_columns import NULL, SEPARATOR, joined


def test_values_and_nulls_are_joined_in_order() -> None:
    assert joined(["a", None, "b"]) == f"a{SEPARATOR}{NULL}{SEPARATOR}b"
    assert joined([]) == ""
    assert joined([None]) == NULL


@pytest.mark.parametrize("values", [
    ["a", f"b{SEPARATOR}c"],  # would shift every later value of the column by one row
    [f"{NULL}", "b"],  # would come back as NULL
    [None, f"x{NULL}"],
    [""],  # a lone empty text comes back as no row at all
])
def test_a_value_the_server_would_split_differently_is_refused(values: list[str | None]) -> None:
    with pytest.raises(ValueError, match="separator"):
        joined(values)
