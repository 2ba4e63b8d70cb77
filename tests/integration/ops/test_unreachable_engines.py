"""Every operator command answers an engine that does not answer with one line naming it,
exit 1, never a traceback (``service/cli.py``'s ``_engine_refusal``). The commands run at
once (the Kafka ones wait out their clients' timeouts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.stack import ROOT

COMMANDS = {
    "verify": ["verify"],
    "explain": ["explain", "TXN-1"],
    "purge": ["purge"],
    "migrate": ["migrate"],
    "accounts load": ["accounts", "load", "@CSV"],
    "topics": ["topics", "--wait", "2"],
    "replay": ["replay", "--to-earliest"],
    "replay --shadow": ["replay", "--to-earliest", "--shadow"],
    "dlq redrive": ["dlq", "redrive"],
    "holds expire": ["holds", "expire", "--execute"],
}


def test_each_command_names_the_engine_that_did_not_answer(tmp_path: Path) -> None:
    accounts = tmp_path / "accounts.csv"
    accounts.write_text("account_id,balance,currency\nACC-1,10.00,EUR\n")
    env = {"PATH": "/usr/bin:/bin", "PAYAUTH_DATABASE_URL": "postgresql://localhost:1/payauth",
           "PAYAUTH_KAFKA_BOOTSTRAP_SERVERS": "localhost:1", "PAYAUTH_LOG_LEVEL": "ERROR"}
    running = {
        name: subprocess.Popen(
            [sys.executable, "-m", "service", *[str(accounts) if a == "@CSV" else a
                                                for a in argv]],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, argv in COMMANDS.items()}
    answers = {}
    for name, process in running.items():
        _out, err = process.communicate(timeout=120)
        # The Kafka client's own log lines are structured (JSON); the answer is the rest.
        own = [line for line in err.splitlines() if not _is_log_line(line)]
        answers[name] = (process.returncode, own)
    for name, (code, lines) in answers.items():
        assert code == 1, (name, code, lines)
        assert len(lines) == 1 and "Traceback" not in "".join(lines), (name, lines)
        engine = "Kafka" if name.startswith(("topics", "replay", "dlq")) else "('127.0.0.1', 1)"
        assert engine in lines[0], (name, lines)
        assert lines[0].startswith(f"payauth {name.split(' --')[0]}: ") or \
            lines[0].startswith("payauth replay --shadow: "), (name, lines)


def _is_log_line(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
