"""``payauth-dev demo`` (``make demo``): the main job end to end on the local stack, with a
ground truth.

Seeds demo accounts, starts two workers in one consumer group, produces a stream with every
kind of duplicate (same message redelivered, producer retry with a new message_id, the same
transaction keyed onto another partition, late redeliveries), declines, conflicts and bad
input; and three holds' lives (placed, partially reversed, cleared; placed after an orphan
reversal, cleared; placed and expired by ``payauth holds expire``, then cleared late); waits
until the group has committed everything; prints what was expected next to what the workers
counted and what the holds became, and the ``payauth verify`` verdict. Exit 0 only if all
agree.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import time
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
from confluent_kafka import Consumer, Producer

from service.adapters.kafka.admin import group_lag
from service.adapters.kafka.config import client_config
from service.config import Settings
from service.devtools.demo_day import (
    DayRow,
    card_controls_setup,
    day_accounts,
    day_events,
    issuers_day,
    print_day,
)
from service.devtools.network_message import authorization_message
from service.devtools.processes import WorkerProcess
from service.domain.vocabulary import DuplicateCause
from service.logs import librdkafka_logger
from service.ops import holds
from service.ops.topics import ensure_topics
from service.ops.verify import report, verify


class DemoStream:
    """Builds the records to send and counts what each should become."""

    def __init__(self, run: str, accounts: dict[str, tuple[Decimal, str, str]],
                 partitions: int, rng: random.Random) -> None:
        self.run = run
        self.accounts = accounts
        self.partitions = partitions
        self.rng = rng
        self.expected: Counter[str] = Counter()
        self.first_wave: list[tuple[str, bytes, int | None]] = []
        self.late_wave: list[tuple[str, bytes, int | None]] = []
        self._sent_valid: list[tuple[str, bytes]] = []
        self._seq = 0
        # hold txn -> (what it shows, expected state, expected released by its end)
        self.holds: dict[str, tuple[str, str, str]] = {}
        self.day: list[DayRow] = []

    def _txn(self) -> str:
        self._seq += 1
        return f"DEMO-{self.run}-{self._seq:06d}"

    def _add(self, key: str, message: dict[str, Any] | bytes, outcome: str,
             partition: int | None = None, late: bool = False) -> bytes:
        raw = message if isinstance(message, bytes) else json.dumps(message).encode()
        (self.late_wave if late else self.first_wave).append((key, raw, partition))
        self.expected[outcome] += 1
        return raw

    def build(self, n_new: int) -> None:
        active = [a for a, (_, cur, st) in self.accounts.items() if st == "ACTIVE" and cur == "EUR"]
        poor = [a for a in active if self.accounts[a][0] < 50]
        blocked = [a for a, (_, _, st) in self.accounts.items() if st == "BLOCKED"]
        usd = [a for a, (_, cur, st) in self.accounts.items() if cur == "USD" and st == "ACTIVE"]
        for _ in range(n_new):
            roll = self.rng.random()
            txn = self._txn()
            if roll < 0.04:
                acc = self.rng.choice(poor)
                msg = authorization_message(txn, account_id=acc, amount="5000.00")
                outcome = "declined"
            elif roll < 0.06:
                acc = f"GHOST-{self.run}-{self._seq}"
                msg = authorization_message(txn, account_id=acc, amount="12.00")
                outcome = "declined"
            elif roll < 0.08:
                acc = self.rng.choice(usd)
                msg = authorization_message(txn, account_id=acc, amount="12.00", currency="EUR")
                outcome = "declined"
            elif roll < 0.09:
                acc = self.rng.choice(blocked)
                msg = authorization_message(txn, account_id=acc, amount="3.00")
                outcome = "declined"
            elif roll < 0.12:
                acc = self.rng.choice(active)
                msg = authorization_message(txn, account_id=acc, amount="15.00",
                                            authorization_type="REFUND")
                outcome = "approved"
            else:
                acc = self.rng.choice([a for a in active if a not in poor])
                amount = f"{self.rng.randint(1, 4000) / 100:.2f}"
                msg = authorization_message(txn, account_id=acc, amount=amount)
                outcome = "approved"
            raw = self._add(acc, msg, outcome)
            self._sent_valid.append((acc, raw))
            self._duplicates(acc, msg, raw)
        self._bad_input()
        self._lifecycles(next(a for a in active if a not in poor))
        self.day = issuers_day(self.run, self._txn, self._add)

    def _lifecycles(self, acc: str) -> None:
        """Three holds on one account (so in order): the third expires between the waves
        (``run_demo`` runs ``holds expire``) and its clearing comes late."""
        def send(kind: str, amount: str, original: str | None = None,
                 late: bool = False) -> str:
            txn = self._txn()
            extra = {} if original is None else {"original_transaction_id": original}
            self._add(acc, authorization_message(txn, account_id=acc, amount=amount,
                                                 authorization_type=kind, **extra),
                      "approved", late=late)
            return txn

        hold = send("AUTHORIZATION", "100.00")
        send("REVERSAL", "30.00", hold)
        send("CLEARING", "60.00", hold)
        self.holds[hold] = ("placed 100, reversed 30, cleared (60 posted)", "CLEARED", "70.00")
        orphaned = f"DEMO-{self.run}-orphaned"
        send("REVERSAL", "20.00", orphaned)  # before its original
        self._add(acc, authorization_message(orphaned, account_id=acc, amount="50.00",
                                             authorization_type="AUTHORIZATION"), "approved")
        send("CLEARING", "30.00", orphaned)
        self.holds[orphaned] = ("orphan reversal 20 first, placed 50, cleared", "CLEARED",
                                "30.00")
        expiring = send("AUTHORIZATION", "40.00")
        send("CLEARING", "40.00", expiring, late=True)  # after the expiry: releases nothing
        self.holds[expiring] = ("placed 40, expired, cleared late", "EXPIRED", "40.00")

    def _duplicates(self, acc: str, msg: dict[str, Any], raw: bytes) -> None:
        roll = self.rng.random()
        if roll < 0.05:  # the broker redelivers the very same message
            self._add(acc, raw, "duplicate")
        elif roll < 0.08:  # the network's producer retries with a new message_id
            new_id = f"retry-{uuid.uuid4().hex[:12]}"
            retry = {**msg, "headers": {**msg["headers"], "message_id": new_id}}
            self._add(acc, retry, "duplicate")
        elif roll < 0.10:  # the same transaction lands on another partition
            self._add(acc, raw, "duplicate", partition=self.rng.randrange(self.partitions))
        elif roll < 0.15:  # redelivered later, after it was decided (the Redis fast path)
            self._add(acc, raw, "duplicate", late=True)

    def _bad_input(self) -> None:
        acc = next(iter(self.accounts))
        for raw in (b'{"headers": {"message_id": "broken"', b"\xff\xfe not utf-8"):
            self._add(acc, raw, "invalid")
        bad_bodies: list[dict[str, Any]] = [
            {"amount": "NaN"}, {"amount": "12.345"}, {"currency": "eur"},
            {"merchant": "Card 4111 1111 1111 1111"}, {"authorization_type": "CHARGEBACK"},
        ]
        for override in bad_bodies:
            base = {"account_id": acc, "amount": "1.00", **override}
            self._add(acc, authorization_message(self._txn(), **base), "invalid")
        # A conflict: a transaction already sent, now with another amount.
        acc, raw = self.rng.choice(self._sent_valid)
        conflicting = json.loads(raw)
        conflicting["body"]["amount"] = "999.99"
        conflicting["headers"]["message_id"] = "conflict-" + uuid.uuid4().hex[:8]
        self._add(acc, conflicting, "conflict", late=True)


async def seed_accounts(dsn: str, run: str, n: int, rng: random.Random
                        ) -> dict[str, tuple[Decimal, str, str]]:
    accounts: dict[str, tuple[Decimal, str, str]] = {}
    for i in range(n):
        account_id = f"ACC-{run}-{i:04d}"
        if i % 25 == 0:
            accounts[account_id] = (Decimal("500.00"), "EUR", "BLOCKED")
        elif i % 20 == 1:
            accounts[account_id] = (Decimal("1000.00"), "USD", "ACTIVE")
        elif i % 10 == 2:
            accounts[account_id] = (Decimal(rng.randint(0, 4000)) / 100, "EUR", "ACTIVE")
        else:
            accounts[account_id] = (Decimal(rng.randint(200_000, 900_000)) / 100, "EUR", "ACTIVE")
    day, small = day_accounts(run)
    cards, controls = card_controls_setup(run)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.executemany(
            "INSERT INTO accounts (account_id, balance, opening_balance, currency, status) "
            "VALUES ($1, $2, $2, $3, $4)",
            [(a, b, c, s) for a, (b, c, s) in accounts.items()]
            + [(day, Decimal("1000.00"), "EUR", "ACTIVE"),
               (small, Decimal("80.00"), "EUR", "ACTIVE"),
               (cards, Decimal("1000.00"), "EUR", "ACTIVE")],
        )
        for statement in controls:
            await conn.execute(statement)
    finally:
        await conn.close()
    return accounts


def produce(settings: Settings, records: list[tuple[str, bytes, int | None]]) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "enable.idempotence": True, "linger.ms": 5,
                         "logger": librdkafka_logger(level=logging.ERROR)})
    for key, raw, partition in records:
        kwargs: dict[str, Any] = {"key": key, "value": raw}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(settings.input_topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(60):
        raise RuntimeError("demo producer could not deliver every record")


def lag(settings: Settings) -> int:
    return sum(group_lag(client_config(settings), settings.group_id,
                         settings.input_topic).values())


def wait_for_zero_lag(settings: Settings, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (remaining := lag(settings)) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers did not catch up: {remaining} messages still unread")
        time.sleep(0.5)


def run_demo(settings: Settings, *, transactions: int, accounts: int, seed: int,
             log_dir: Path, ports: tuple[int, ...] = (9101, 9102)) -> int:
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:6]
    log_dir.mkdir(parents=True, exist_ok=True)
    dsn = settings.database_url.get_secret_value()
    print(f"demo: run {run}: {accounts} accounts, {transactions} new authorizations, seed {seed}")
    ensure_topics(settings)
    book = asyncio.run(seed_accounts(dsn, run, accounts, rng))
    partitions = len(Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                               "group.id": "demo-meta",
                               "logger": librdkafka_logger(level=logging.ERROR)}).list_topics(
        settings.input_topic, timeout=10).topics[settings.input_topic].partitions)
    stream = DemoStream(run, book, partitions, rng)
    stream.build(transactions)

    env = dict(os.environ, PAYAUTH_GROUP_INSTANCE_ID="", PAYAUTH_COMMIT_INTERVAL_MS="200")
    workers = [WorkerProcess({**env, "PAYAUTH_METRICS_PORT": str(port)},
                             log_dir / f"worker-{i + 1}.log").start()
               for i, port in enumerate(ports)]
    try:
        print(f"demo: two workers started (metrics on :{ports[0]} and :{ports[1]}, "
              f"logs in {log_dir})")
        produce(settings, stream.first_wave)
        print(f"demo: produced {len(stream.first_wave)} records; waiting for the workers")
        wait_for_zero_lag(settings, timeout=300)
        time.sleep(1.5)  # the expiring hold is older than a second now; the others ended
        expired = asyncio.run(holds.expire(settings.model_copy(
            update={"hold_expiry_hours": 1 / 3600}), execute=True))
        print(f"demo: payauth holds expire (holds older than 1 s): {len(expired.holds)} "
              "hold(s) expired")
        produce(settings, stream.late_wave)
        print(f"demo: produced {len(stream.late_wave)} late redeliveries and a conflict")
        wait_for_zero_lag(settings, timeout=300)
        observed: Counter[str] = Counter()
        for worker in workers:
            for name, value in worker.metrics().items():
                if name.startswith("payauth_"):
                    observed[name] += int(value)
    finally:
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            worker.wait_exit(60)

    text, ok = report(asyncio.run(verify(dsn)))
    lives = asyncio.run(hold_lives(dsn, list(stream.holds)))
    events = day_events(settings, {txn for _, txn, _ in stream.day})
    return print_summary(stream.expected, observed, text, ok, stream.holds, lives,
                         stream.day, events)


async def hold_lives(dsn: str, txn_ids: list[str]) -> dict[str, tuple[str, str]]:
    """Each hold's state and what its end released, as the database has them."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT txn_id, state, released::text AS released FROM holds "
                                "WHERE txn_id = ANY($1::text[])", txn_ids)
    finally:
        await conn.close()
    return {r["txn_id"]: (r["state"], f"{Decimal(r['released'] or 0):.2f}") for r in rows}


def print_summary(expected: Counter[str], observed: Counter[str], verdict: str, ok: bool,
                  holds_expected: dict[str, tuple[str, str, str]] | None = None,
                  holds_observed: dict[str, tuple[str, str]] | None = None,
                  day: list[DayRow] | None = None,
                  day_observed: dict[str, list[dict[str, Any]]] | None = None) -> int:
    def got(outcome: str) -> int:
        return observed[f'payauth_messages_total{{outcome="{outcome}"}}']

    rows = [(o, expected[o], got(o)) for o in ("approved", "declined", "duplicate", "conflict",
                                                "invalid")]
    dead = sum(v for k, v in observed.items() if k.startswith("payauth_dead_letters_total"))
    print()
    print(f"{'outcome':<28}{'expected':>10}{'observed':>10}")
    print("-" * 48)
    for name, exp, obs in rows:
        print(f"{name:<28}{exp:>10}{obs:>10}{'' if exp == obs else '   <-- MISMATCH'}")
    for layer in ("redis", "postgres"):
        caught = observed['payauth_duplicates_total{layer="' + layer + '"}']
        print(f"{'  caught by ' + layer:<28}{'':>10}{caught:>10}")
    for cause in DuplicateCause:
        count = observed.get(f'payauth_duplicates_total{{cause="{cause.value}"}}', 0)
        if count:
            print(f"{'  cause ' + cause.value:<28}{'':>10}{count:>10}")
    print(f"{'dead-lettered':<28}{expected['invalid'] + expected['conflict']:>10}{dead:>10}")
    for key in sorted(k for k, v in observed.items()
                      if k.startswith("payauth_dead_letters_total") and v):
        reason = key.split('"')[1]
        print(f"{'  ' + reason:<28}{'':>10}{observed[key]:>10}")
    print(f"{'total messages':<28}{sum(expected.values()):>10}"
          f"{sum(got(o) for o, _, _ in rows):>10}")
    lives_agree = True
    if holds_expected:
        print()
        print(f"{'hold':<46}{'expected':>16}{'observed':>16}")
        print("-" * 78)
        for txn, (story, state, released) in holds_expected.items():
            seen = (holds_observed or {}).get(txn, ("none", "-"))
            exp_text, obs_text = f"{state} {released}", f"{seen[0]} {seen[1]}"
            lives_agree &= exp_text == obs_text
            print(f"{story:<46}{exp_text:>16}{obs_text:>16}"
                  f"{'' if exp_text == obs_text else '   <-- MISMATCH'}")
    day_agrees = print_day(day, day_observed or {}) if day else True
    print()
    print(verdict)
    agree = all(exp == obs for _, exp, obs in rows) and lives_agree and day_agrees
    if not agree:
        print("demo: the workers' counts do not match the ground truth")
    return 0 if agree and ok else 1

