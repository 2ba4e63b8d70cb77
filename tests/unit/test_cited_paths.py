"""Every repository path the README, ``docs/``, ``ARCHITECTURE.md`` and the code's comments cite
exists: a reader sent to a file finds it (a rule moved, a test renamed, a module split fail
here, not in a reader's hands). A cited pattern (``tests/integration/sql/test_payauth_*.py``,
``migrations/NNN_*.sql``, ``tests/unit/ops/test_COMMAND.py``) must match at least one
file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A path into the repository: one of its top-level folders, then at least one more part.
_CITED = re.compile(
    r"(?<![\w./-])((?:service|tests|sql|migrations|deploy|docs|\.ci)/[\w.*/-]*[\w*/])")
# Where paths are cited: the prose, and the code's comments and docstrings (read whole:
# a path in a string literal is cited too).
_DOCUMENTS = ("README.md", "ARCHITECTURE.md", "docs/*.md")
# (Not the migrations: a released one is never edited, and tells what was true then.)
_CODE = ("service/**/*.py", "tests/**/*.py", "sql/*.sql", "deploy/**/*.sh",
         "deploy/**/*.yaml", "deploy/**/*.yml", "Makefile", "Dockerfile", ".ci/run",
         "docker-compose*.yml")
# Made at run time, not kept in the repository.
_RUNTIME = ("deploy/image/rootfs", "tests/deploy/crds/cache")


def _sources() -> list[Path]:
    found: set[Path] = set()
    for pattern in (*_DOCUMENTS, *_CODE):
        found.update(p for p in ROOT.glob(pattern) if p.is_file())
    this = Path(__file__).resolve()  # its own example of a missing path, below
    return sorted(p for p in found if ".venv" not in p.parts and p != this)


def _exists(cited: str) -> bool:
    # A word in capitals is a placeholder: NNN (a migration's number), MODULE, COMMAND.
    path = re.sub(r"[A-Z]{3,}", "*", cited.rstrip("/."))
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def cited_paths(text: str) -> set[str]:
    return {m.group(1) for m in _CITED.finditer(text)}


def test_every_cited_path_exists() -> None:
    missing = []
    for source in _sources():
        for cited in cited_paths(source.read_text(errors="replace")):
            if cited.startswith(_RUNTIME) or _exists(cited):
                continue
            missing.append(f"{source.relative_to(ROOT)}: {cited}")
    assert missing == []


def test_a_path_that_does_not_exist_is_caught() -> None:
    text = "see `sql/payauth_decide.sql` and `sql/payauth_gone.sql`, tests/unit/test_*.py"
    assert {c for c in cited_paths(text) if not _exists(c)} == {"sql/payauth_gone.sql"}
