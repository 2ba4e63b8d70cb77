"""The operators' CSV files (``accounts load``, ``cards load``, ``limits load``, ``blocks
load|lift``), read one way: an optional header line naming the columns, blank lines
skipped, cells trimmed, every row checked before anything is loaded, and every bad line
named with its number and reason."""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Row = TypeVar("Row")


class FileInvalid(Exception):
    """The file cannot be loaded; ``problems`` names each bad line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"{len(problems)} bad line(s); nothing loaded")
        self.problems = problems


def parse(text: str, columns: tuple[str, ...], required: int,
          make: Callable[[int, list[str]], Row], key: Callable[[Row], str]) -> list[Row]:
    """Every row of ``text`` made by ``make(line, cells)`` (which raises ``ValueError`` with
    the reason); ``columns`` the file's, the first ``required`` of them required; ``key`` what
    two rows may not share. Raises ``FileInvalid`` naming each bad line."""
    rows: list[Row] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    header = ",".join(columns[:required]) + "".join(f"[,{c}" for c in columns[required:]) \
        + "]" * (len(columns) - required)
    for number, fields in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not fields or all(not f.strip() for f in fields):
            continue
        cells = [f.strip() for f in fields]
        if number == 1 and cells[0] == columns[0]:
            if tuple(cells) not in {columns[:n] for n in range(required, len(columns) + 1)}:
                problems.append(f"line 1: header must be {header}")
            continue
        if not required <= len(cells) <= len(columns):
            problems.append(f"line {number}: expected the columns {header}, got "
                            f"{len(cells)}")
            continue
        try:
            row = make(number, cells + [""] * (len(columns) - len(cells)))
        except ValueError as exc:
            problems.append(f"line {number}: {exc}")
            continue
        if key(row) in seen:
            problems.append(f"line {number}: {columns[0]} {key(row)} already on line "
                            f"{seen[key(row)]}")
            continue
        seen[key(row)] = number
        rows.append(row)
    if problems:
        raise FileInvalid(problems)
    return rows


def report(name: str, exc: FileInvalid) -> int:
    """Every bad line on stderr, then the verdict; the command's exit status (1)."""
    for problem in exc.problems:
        print(f"{name}: {problem}", file=sys.stderr)
    print(f"{name}: {exc}", file=sys.stderr)
    return 1


def read_or_report(name: str, path: str, read: Callable[[Path], list[Row]]
                   ) -> list[Row] | None:
    """The rows of an operator's file, or None once every bad line (or why the file cannot
    be read) is on stderr."""
    try:
        return read(Path(path))
    except FileInvalid as exc:
        report(name, exc)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{name}: cannot read {path}: {exc}", file=sys.stderr)
    return None
