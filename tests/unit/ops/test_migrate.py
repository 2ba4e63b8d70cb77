"""``payauth migrate`` (``service/ops/migrate.py``): the packaged migrations and definitions
are found, the definitions' stated order is checked against the files, and its flags."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.cli import build_parser
from service.ops.migrate import (
    DEFINITIONS_DIR,
    MIGRATIONS_DIR,
    FilesRefused,
    definition_files,
    migration_files,
)
from tests.support.cli import refusal

REPOSITORY = Path(__file__).resolve().parents[3]


def test_the_default_directories_are_the_repositorys() -> None:
    assert MIGRATIONS_DIR == REPOSITORY / "migrations"
    assert DEFINITIONS_DIR == REPOSITORY / "sql"
    assert [p.name for p in migration_files()] == sorted(
        p.name for p in (REPOSITORY / "migrations").glob("*.sql"))
    assert sorted(p.name for p in definition_files()) == sorted(
        p.name for p in (REPOSITORY / "sql").glob("*.sql"))


def _definitions(tmp_path: Path, order: str, *files: str) -> Path:
    for name in files:
        (tmp_path / name).write_text("SELECT 1;\n")
    (tmp_path / "ORDER").write_text(order)
    return tmp_path


def test_the_definitions_come_in_the_stated_order(tmp_path: Path) -> None:
    directory = _definitions(tmp_path, "# why this order\nb.sql\na.sql  # after b\n",
                             "a.sql", "b.sql")
    assert [p.name for p in definition_files(directory)] == ["b.sql", "a.sql"]


@pytest.mark.parametrize(("order", "files", "said"), [
    ("a.sql\n", ("a.sql", "b.sql"), "present but not listed ['b.sql']"),
    ("a.sql\nb.sql\n", ("a.sql",), "listed but missing ['b.sql']"),
    ("a.sql\na.sql\n", ("a.sql",), "listed twice"),
])
def test_an_order_that_disagrees_with_the_files_is_refused(
        tmp_path: Path, order: str, files: tuple[str, ...], said: str) -> None:
    with pytest.raises(FilesRefused, match=re.escape(said)):
        definition_files(_definitions(tmp_path, order, *files))


def test_a_definitions_directory_without_its_order_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FilesRefused, match="no ORDER file"):
        definition_files(tmp_path)


def test_a_missing_directory_is_one_line(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    line = refusal(capsys, "migrate", "--dir", str(tmp_path / "none"))
    assert line.startswith("payauth migrate: ") and "--dir" in line
    line = refusal(capsys, "migrate", "--sql-dir", str(tmp_path / "none"))
    assert line.startswith("payauth migrate: ") and "--sql-dir" in line


def test_existing_directories_are_taken(tmp_path: Path) -> None:
    args = build_parser().parse_args(["migrate", "--dir", str(tmp_path),
                                      "--sql-dir", str(tmp_path)])
    assert (args.dir, args.sql_dir) == (str(tmp_path), str(tmp_path))
