"""A batch's columns sent to PostgreSQL as one text each, split back into arrays by the server
(the authorize call's ten columns, the dedup lookup's keys).

``joined(values)`` in Python and ``split("$n")`` in the statement (``string_to_array``). asyncpg
encodes an array parameter element by element, in Python: the same columns joined cost the
worker a tenth of that and the server little more (docs/benchmark.md, "Design figures").

The unit separator (``\\x1f``) parts values and the record separator (``\\x1e``) stands for
NULL. No value the worker sends can hold either (identifiers are printable ASCII; the rest are
amounts, currency and type codes, hex digests and numbers), and ``joined`` refuses one that
does: a stray separator would shift every later value of its column onto the next row.
"""

from __future__ import annotations

from collections.abc import Sequence

SEPARATOR = "\x1f"
NULL = "\x1e"


def split(parameter: str, cast: str = "") -> str:
    """The SQL that turns ``parameter`` (a ``joined`` text) back into an array."""
    return f"string_to_array({parameter}, E'\\x1f', E'\\x1e'){cast}"


def joined(values: Sequence[str | None]) -> str:
    """``values`` as one text for ``split``; raises ``ValueError`` for a value holding a
    separator, or a single empty one (it would come back as no row at all)."""
    nulls = values.count(None)
    text = SEPARATOR.join([NULL if v is None else v for v in values] if nulls
                          else values)  # type: ignore[arg-type]  # no None in it
    if text.count(SEPARATOR) != max(len(values) - 1, 0) or text.count(NULL) != nulls \
            or (values and not text):
        raise ValueError("a value holds a column separator (\\x1f, \\x1e) or is a lone ''")
    return text
