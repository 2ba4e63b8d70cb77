"""``payauth migrate`` (``service/ops/migrate.py``): the packaged migrations are found, and
its flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import build_parser
from service.ops.migrate import MIGRATIONS_DIR, migration_files
from tests.support.cli import refusal

REPOSITORY_MIGRATIONS = Path(__file__).resolve().parents[3] / "migrations"


def test_the_default_directory_is_the_repositorys_migrations() -> None:
    assert MIGRATIONS_DIR == REPOSITORY_MIGRATIONS
    assert [p.name for p in migration_files()] == sorted(
        p.name for p in REPOSITORY_MIGRATIONS.glob("*.sql"))


def test_a_missing_directory_is_one_line(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    line = refusal(capsys, "migrate", "--dir", str(tmp_path / "none"))
    assert line.startswith("payauth migrate: ") and "--dir" in line


def test_an_existing_directory_is_taken(tmp_path: Path) -> None:
    assert build_parser().parse_args(["migrate", "--dir", str(tmp_path)]).dir == str(tmp_path)
