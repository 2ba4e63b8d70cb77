"""The lifecycle tests' vocabulary: messages of each kind keyed by account, the cards and
limits an operator loads, one worker run over them, and what the database and the topics
hold afterwards."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up


def names(*names: str) -> dict[str, str]:
    run = uuid.uuid4().hex[:8]
    return {n: f"LC-{run}-{n}" for n in names}


def msg(txn: str, kind: str, account: str, amount: str, original: str | None = None,
         **fields: Any) -> dict[str, Any]:
    extra = {} if original is None else {"original_transaction_id": original}
    return auth_message(txn, account_id=account, amount=amount, authorization_type=kind,
                        **extra, **fields)


def run(env: stack.Env, spawn_worker: Any, messages: list[dict[str, Any]]) -> Any:
    """Send the messages (keyed by account, so in order per account), one worker decides
    them all; returns the worker (still running)."""
    stack.produce(env.input_topic, [(m["body"]["account_id"].encode(), encode(m))
                                    for m in messages])
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    return worker


def send_more(env: stack.Env, messages: list[dict[str, Any]]) -> None:
    stack.produce(env.input_topic, [(m["body"]["account_id"].encode(), encode(m))
                                    for m in messages])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)


def balances(env: stack.Env, account: str) -> tuple[Decimal, Decimal, Decimal]:
    row = stack.fetch(env.dsn, "SELECT balance, held, available FROM account_balances "
                               "WHERE account_id = $1", account)[0]
    copy = stack.fetch(env.dsn, "SELECT held FROM accounts WHERE account_id = $1", account)
    assert copy[0]["held"] == row["held"]  # the decision's copy agrees with the holds
    return row["balance"], row["held"], row["available"]


def hold(env: stack.Env, txn: str) -> dict[str, Any]:
    rows = stack.fetch(env.dsn, "SELECT amount, remaining, state, ended_by, released "
                                "FROM holds WHERE txn_id = $1", txn)
    return dict(rows[0]) if rows else {}


def events(env: stack.Env, expect: int) -> dict[str, dict[str, Any]]:
    """The output topic's events by transaction_id; a ReversalApplied (an orphan reversal
    applied when its original came) under ``applied(its transaction_id)``, a HoldExpired
    under ``expired(its hold's)``."""
    events = stack.events_of(stack.read_topic(env.output_topic, expect=expect))
    by_txn: dict[str, dict[str, Any]] = {}
    for e in events:
        key = {"ReversalApplied": applied, "HoldExpired": expired}.get(
            e["event_type"], str)(e["transaction_id"])
        assert by_txn.setdefault(key, e) == e  # a repeat is the same event
    return by_txn


def applied(reversal: str) -> str:
    """The key of an orphan reversal's ReversalApplied in ``events``."""
    return f"{reversal}/applied"


def expired(hold: str) -> str:
    """The key of a hold's HoldExpired in ``events``."""
    return f"{hold}/expired"


def ledger(env: stack.Env, account: str) -> list[tuple[str, str, Decimal]]:
    rows = stack.fetch(env.dsn, "SELECT txn_id, type, amount FROM ledger_entries "
                                "WHERE account_id = $1 ORDER BY created_at, txn_id", account)
    return [(r["txn_id"], r["type"], r["amount"]) for r in rows]


def dead_letters(env: stack.Env, expect: int) -> list[tuple[str, str]]:
    records = stack.read_topic(env.dlq_topic, expect=expect)
    out = []
    for r in records:
        headers = dict(r.headers() or [])
        out.append((headers["error.reason"].decode(), headers["error.detail"].decode()))
    return out


def verified(env: stack.Env) -> None:
    done = payauth(env, "verify")
    assert done.returncode == 0, done.stdout + done.stderr


def seed(env: stack.Env, *accounts: tuple[str, str]) -> None:
    asyncio.run(stack.seed_accounts(env.dsn, [(a, b, "EUR") for a, b in accounts]))


def admin(env: stack.Env, *args: str) -> str:
    """An operator's command, as the database's owner; it must succeed."""
    done = payauth(env, *args, PAYAUTH_DATABASE_URL=env.dsn)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def controls(env: stack.Env, tmp_path: Path, cards: list[str], limits: list[str]) -> None:
    """Load the cards (``card_id,account_id[,status,expires_on]`` lines) and the limits (the
    columns of spending_limits) with ``payauth cards load`` and ``payauth limits load``."""
    if cards:
        (tmp_path / "cards.csv").write_text("\n".join(cards) + "\n")
        admin(env, "cards", "load", str(tmp_path / "cards.csv"))
    if limits:
        (tmp_path / "limits.csv").write_text("\n".join(limits) + "\n")
        admin(env, "limits", "load", str(tmp_path / "limits.csv"))
