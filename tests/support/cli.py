"""Running ``payauth`` in process for its answers to bad flags (no engine is reached: flags
are checked before anything connects)."""

from __future__ import annotations

import pytest

from service.cli import main


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line ``payauth ARGV`` answers with on stderr, after checking it exits 2 (a
    usage error) and prints nothing else: no traceback, no usage block."""
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    out, err = capsys.readouterr()
    assert stopped.value.code == 2, (argv, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]
