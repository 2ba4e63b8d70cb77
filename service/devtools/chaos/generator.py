"""The load generator: sends authorizations of every kind and writes a ground-truth log.

Outcomes are made deterministic by the accounts they target, whatever the interleaving:
rich accounts (never run out) approve purchases and refunds; an empty account declines for
funds; a blocked one, a USD one (EUR requests) and a missing one decline for their reasons;
each partial approval has an account of its own whose balance it asks more than; a card
frozen from the start declines its purchases. So the checker knows each transaction's
right result without replaying the worker's logic; the one exception is a verification on
the card frozen and thawed among the faults, judged by the status its decision read
(cards.py).

Each log line is one message as the broker acknowledged it (partition and offset from the
delivery report; one acknowledged without an offset is found in its partition once the
load is over, placement.py):

    {"seq": 17, "kind": "dup_new_message_id", "txn": "CH-ab12-000017", "fp": "…",
     "expect": "approved", "reason": null, "partition": 3, "offset": 1204,
     "key": "…", "acked": 1796021814.761,
     "type": "REVERSAL", "amount": "12.50", "original": "CH-ab12-000009", "pinned": false}

``expect`` is the transaction's result (approved/declined), or ``conflict`` / ``invalid``
for messages that must end in the dead-letter topic (``reason`` then says which). A valid
message also carries its ``type``, ``amount`` and ``original``, and when the message has
them its ``currency``, ``billing_amount``/``billing_currency``, ``partial`` (partial
approval supported), ``final`` (a clearing's) and ``approved`` (what a partial approval
approves): what the checker's model of the money reads, lifecycle_model.py. ``card`` is
the card a message names, and ``toggle`` what had changed of the toggled card when it was
sent (changes started, done, the last status, whether one never answered; cards.py).
``pinned`` marks one sent to a partition of the generator's choosing rather than its key's.

Among the purchases go lifecycles (``lc_*`` kinds, lifecycles.py): a share
(``lifecycle_share``) of the steps starts one, whose later messages are sent when due,
spread over ``lifecycle_span`` seconds (long enough for some holds to expire in between);
``close()`` sends what is still due before it flushes, so the log holds every lifecycle
whole. Their duplicates stay on the key's partition: an order across partitions is one the
log cannot know.
"""

from __future__ import annotations

import heapq
import json
import logging
import random
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import asyncpg
from confluent_kafka import Producer

from service.devtools.chaos import cards, placement
from service.devtools.chaos.lifecycles import Planned, Scripts
from service.devtools.network_message import authorization_message
from service.domain.messages import decode_authorization
from service.logs import librdkafka_logger

RICH_BALANCE = Decimal("1000000000.00")


@dataclass(frozen=True)
class Accounts:
    rich: list[str]
    empty: str
    blocked: str
    usd: str
    missing: str
    partial: list[tuple[str, Decimal]]  # (account, balance): one partial approval each
    # The card controls (cards.py): a rich account's card with limits is cards.card_of(it);
    # a card frozen all along, and the card frozen and thawed among the faults.
    frozen: tuple[str, str] = ("", "")  # (account, card)
    toggle: cards.CardToggle | None = None


async def seed_accounts(dsn: str, run: str, n_rich: int = 50, n_partial: int = 400
                        ) -> Accounts:
    rng = random.Random(run)
    accounts = Accounts(
        rich=[f"CHR-{run}-{i:03d}" for i in range(n_rich)],
        empty=f"CHE-{run}", blocked=f"CHB-{run}", usd=f"CHU-{run}", missing=f"CHM-{run}",
        partial=[(f"CHP-{run}-{i:03d}", Decimal(rng.randint(500, 20_000)) / 100)
                 for i in range(n_partial)],
        frozen=(f"CHF-{run}", f"CHF-{run}-CARD"),
        toggle=cards.CardToggle(f"CHT-{run}", f"CHT-{run}-CARD"),
    )
    assert accounts.toggle is not None
    rows = [(a, RICH_BALANCE, "EUR", "ACTIVE") for a in accounts.rich]
    rows += [(a, balance, "EUR", "ACTIVE") for a, balance in accounts.partial]
    rows += [(accounts.empty, Decimal(0), "EUR", "ACTIVE"),
             (accounts.blocked, Decimal(1000), "EUR", "BLOCKED"),
             (accounts.usd, Decimal(1000), "USD", "ACTIVE"),
             (accounts.frozen[0], RICH_BALANCE, "EUR", "ACTIVE"),
             (accounts.toggle.account, RICH_BALANCE, "EUR", "ACTIVE")]
    conn = await asyncpg.connect(dsn)
    try:
        await conn.executemany(
            "INSERT INTO accounts (account_id, balance, opening_balance, currency, status) "
            "VALUES ($1, $2, $2, $3, $4)", rows)
        for statement, args in cards.setup_statements(
                accounts.rich, accounts.frozen, (accounts.toggle.account, accounts.toggle.card)):
            await conn.execute(statement, *args)
    finally:
        await conn.close()
    return accounts


def conflict_in(body: dict[str, Any]) -> None:
    """Makes ``body`` another request under the same transaction_id: one more unit of its
    amount in the amount's own precision (yen have none), or for a kind whose amount is 0
    (a verification, an inquiry) another currency."""
    amount = Decimal(str(body["amount"]))
    if amount == 0:
        body["currency"] = "USD" if body.get("currency") != "USD" else "EUR"
    else:
        body["amount"] = str((amount + 1).quantize(amount))


_INVALID: list[tuple[str, str]] = [
    ("invalid_json", "INVALID_JSON"),
    ("invalid_nan", "INVALID_JSON"),
    ("invalid_decimals", "SCHEMA_VIOLATION"),
    ("invalid_currency", "SCHEMA_VIOLATION"),
    ("invalid_missing_key", "SCHEMA_VIOLATION"),
    ("invalid_pan", "CARD_DATA_PRESENT"),
]


class LoadGenerator:
    def __init__(self, *, bootstrap: str, topic: str, partitions: int, run: str,
                 accounts: Accounts, log_path: Path, seed: int,
                 late_after_seconds: float = 30.0, lifecycle_share: float = 0.08,
                 lifecycle_span: float = 40.0,
                 orphan_purchase_reversals: bool = True) -> None:
        # the broker restarts on purpose: one line per interval
        self._client_conf = {"bootstrap.servers": bootstrap,
                             "logger": librdkafka_logger(level=logging.ERROR)}
        self._producer = Producer({**self._client_conf, "enable.idempotence": True,
                                   "acks": "all", "linger.ms": 5,
                                   "message.timeout.ms": 300_000})
        self._unplaced: list[placement.Unplaced] = []  # acknowledged without an offset
        self.placed = 0
        self._topic = topic
        self._partitions = partitions
        self._run = run
        self._accounts = accounts
        self._rng = random.Random(seed)
        self._log_path = log_path
        self._log: IO[str] = log_path.open("w")
        self._log_lock = threading.Lock()
        self._seq = 0
        self._txn_seq = 0
        self._late_after = late_after_seconds
        # Messages kept for later duplicates: (sent_at, key, raw, txn, fp, expect, fields)
        self._history: deque[tuple[float, str, bytes, str, str, str, dict[str, Any]]] = \
            deque(maxlen=5000)
        self._lifecycle_share = lifecycle_share
        self._scripts = Scripts(self._rng, self._txn_id, span=lifecycle_span,
                                orphan_purchase_reversals=orphan_purchase_reversals,
                                partial=accounts.partial)
        self._due: list[tuple[float, int, Planned]] = []  # heap: (due, order, message)
        self._planned = 0
        self.sent: Counter[str] = Counter()
        self.failed: list[str] = []

    @property
    def lifecycle_sent(self) -> int:
        """Messages of lifecycles sent (their duplicates and conflicts included)."""
        return sum(n for kind, n in self.sent.items() if kind.startswith("lc_"))

    # ---------------------------------------------------------------- sending
    def _send(self, kind: str, key: str, raw: bytes, *, txn: str | None, fp: str | None,
              expect: str, reason: str | None = None, partition: int | None = None,
              fields: dict[str, Any] | None = None) -> None:
        self._seq += 1
        seq = self._seq

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self.failed.append(f"{kind} {txn}: {err}")
                return
            line = {"seq": seq, "kind": kind, "txn": txn, "fp": fp, "expect": expect,
                    "reason": reason, "partition": msg.partition(), "offset": msg.offset(),
                    "key": key, "acked": round(time.time(), 3), **(fields or {}),
                    "pinned": partition is not None}
            with self._log_lock:
                if line["offset"] is None or line["offset"] < 0:
                    self._unplaced.append((line, raw))  # see placement.py
                    return
                self._log.write(json.dumps(line) + "\n")

        kwargs: dict[str, Any] = {"key": key, "value": raw, "on_delivery": delivered}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(self._topic, **kwargs)
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)
        self.sent[kind] += 1

    def _txn_id(self) -> str:
        self._txn_seq += 1
        return f"CH-{self._run}-{self._txn_seq:07d}"

    # ------------------------------------------------------------------ kinds
    def _valid(self) -> tuple[str, str, dict[str, Any], str]:
        """A new transaction: (kind, key, message, expected result)."""
        a = self._accounts
        roll = self._rng.random()
        txn = self._txn_id()
        amount = f"{self._rng.randint(1, 50_000) / 100:.2f}"
        if roll < 0.70:
            acc = self._rng.choice(a.rich)
            # Half on the account's card, whose limits count them (cards.py).
            card = {"card_id": cards.card_of(acc)} if self._rng.random() < 0.5 else {}
            return "new_purchase", acc, authorization_message(txn, account_id=acc,
                                                              amount=amount, **card), "approved"
        if roll < 0.76:
            acc = self._rng.choice(a.rich)
            return "new_refund", acc, authorization_message(
                txn, account_id=acc, amount=amount, authorization_type="REFUND"), "approved"
        if roll < 0.82:
            return "decline_funds", a.empty, authorization_message(
                txn, account_id=a.empty, amount=amount), "declined"
        if roll < 0.88:
            return "decline_blocked", a.blocked, authorization_message(
                txn, account_id=a.blocked, amount=amount), "declined"
        if roll < 0.94:
            return "decline_currency", a.usd, authorization_message(
                txn, account_id=a.usd, amount=amount), "declined"
        if roll < 0.96:
            return "decline_unknown", a.missing, authorization_message(
                txn, account_id=a.missing, amount=amount), "declined"
        if roll < 0.98 or a.toggle is None:
            return "decline_card_frozen", a.frozen[0], authorization_message(
                txn, account_id=a.frozen[0], amount=amount, card_id=a.frozen[1]), "declined"
        # On the card frozen and thawed among the faults: decided by the status it reads
        # (the checker holds it to that, cards.toggle_findings).
        return "card_toggled_verification", a.toggle.account, authorization_message(
            txn, account_id=a.toggle.account, amount="0.00", authorization_type="VERIFICATION",
            card_id=a.toggle.card), "approved"

    def step(self) -> None:
        """Send one new transaction, sometimes followed by duplicates, a conflict or junk;
        sometimes start a lifecycle; send the lifecycles' messages now due."""
        kind, key, message, expect = self._valid()
        self._send_new(kind, key, message, expect, lifecycle=False)
        if self._rng.random() < self._lifecycle_share:
            start = time.monotonic()
            for planned in self._scripts.next(self._rng.choice(self._accounts.rich),
                                              self._accounts.empty):
                self._planned += 1
                heapq.heappush(self._due, (start + planned.at, self._planned, planned))
        self._send_due(time.monotonic())
        if self._rng.random() < 0.05:
            self._late_duplicate()

    def _send_due(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            planned = heapq.heappop(self._due)[2]
            self._send_new(planned.kind, planned.account, planned.message, planned.expect,
                           lifecycle=True, approved=planned.approved)

    def _send_new(self, kind: str, key: str, message: dict[str, Any], expect: str, *,
                  lifecycle: bool, approved: str | None = None) -> None:
        body = message["body"]
        fields = {"type": body["authorization_type"], "amount": str(body["amount"]),
                  "original": body.get("original_transaction_id")}
        if body.get("currency", "EUR") != "EUR":
            fields["currency"] = body["currency"]
        for name, field in (("billing_amount", "billing_amount"),
                            ("billing_currency", "billing_currency"),
                            ("partial", "partial_approval_supported"), ("final", "final")):
            if body.get(field) is not None:
                fields[name] = body[field]
        if approved is not None:
            fields["approved"] = approved
        if body.get("card_id") is not None:
            fields["card"] = body["card_id"]
            toggle = self._accounts.toggle
            if toggle is not None and body["card_id"] == toggle.card:
                fields["toggle"] = toggle.now()  # what had changed when it was sent
        raw = json.dumps(message).encode()
        auth = decode_authorization(raw)
        txn, fp = auth.transaction_id, auth.fingerprint
        self._send(kind, key, raw, txn=txn, fp=fp, expect=expect, fields=fields)
        self._history.append((time.monotonic(), key, raw, txn, fp, expect, fields))
        prefix = "lc_" if lifecycle else ""
        roll = self._rng.random()
        if roll < 0.08:
            self._send(prefix + "dup_same_message", key, raw, txn=txn, fp=fp, expect=expect,
                       fields=fields)
        elif roll < 0.14:
            retry = json.loads(raw)
            retry["headers"]["message_id"] = f"retry-{uuid.uuid4().hex[:12]}"
            self._send(prefix + "dup_new_message_id", key, json.dumps(retry).encode(),
                       txn=txn, fp=fp, expect=expect, fields=fields)
        elif roll < 0.19 and not lifecycle:
            # only plain purchases and refunds: their order does not matter, a lifecycle's
            # does (see lifecycle_model.py)
            self._send("dup_other_partition", key, raw, txn=txn, fp=fp, expect=expect,
                       partition=self._rng.randrange(self._partitions), fields=fields)
        elif roll < 0.22 and kind != "new_refund":
            conflicting = json.loads(raw)
            conflict_in(conflicting["body"])
            conflicting["headers"]["message_id"] = f"conflict-{uuid.uuid4().hex[:12]}"
            # Same key, so the same partition, after the original: the original decides.
            self._send(prefix + "conflict", key, json.dumps(conflicting).encode(), txn=txn,
                       fp=decode_authorization(json.dumps(conflicting).encode()).fingerprint,
                       expect="conflict", reason="IDEMPOTENCY_KEY_CONFLICT")
        elif roll < 0.25 and not lifecycle:
            name, reason = self._rng.choice(_INVALID)
            self._send(name, key, self._invalid(name, key), txn=None, fp=None,
                       expect="invalid", reason=reason)

    def _late_duplicate(self) -> None:
        """Re-send a message decided long ago (past the Redis TTL in a chaos run)."""
        now = time.monotonic()
        old = [h for h in list(self._history)[:500] if now - h[0] > self._late_after]
        if old:
            _, key, raw, txn, fp, expect, fields = self._rng.choice(old)
            kind = "lc_dup_late_replay" if fields["type"] not in ("PURCHASE", "REFUND") \
                else "dup_late_replay"
            self._send(kind, key, raw, txn=txn, fp=fp, expect=expect, fields=fields)

    def _invalid(self, name: str, key: str) -> bytes:
        txn = self._txn_id()
        message = authorization_message(txn, account_id=key, amount="1.00")
        if name == "invalid_json":
            return json.dumps(message).encode()[:-7]
        if name == "invalid_nan":
            return json.dumps(message).replace('"1.00"', "NaN").encode()
        if name == "invalid_decimals":
            message["body"]["amount"] = "1.001"
        elif name == "invalid_currency":
            message["body"]["currency"] = "eur"
        elif name == "invalid_missing_key":
            del message["body"]["transaction_id"]
        elif name == "invalid_pan":
            message["body"]["merchant"] = "card 4111 1111 1111 1111"
        return json.dumps(message).encode()

    # ------------------------------------------------------------------- runs
    def run(self, *, seconds: float, rate: float, stop: threading.Event | None = None) -> None:
        """Send about ``rate`` new transactions a second for ``seconds`` (or until ``stop``)."""
        interval = 1.0 / rate
        deadline = time.monotonic() + seconds
        next_at = time.monotonic()
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            self.step()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def close(self) -> None:
        self._send_due(float("inf"))  # every lifecycle whole in the log
        remaining = self._producer.flush(300)
        if remaining:
            self.failed.append(f"{remaining} messages never acknowledged")
        with self._log_lock:
            self._log.flush()
            placed, missing = placement.place(self._client_conf, self._topic,
                                              self._unplaced, self._log_path)
            for line in placed:
                self._log.write(json.dumps(line) + "\n")
            self.failed += [f"{line['kind']} {line['txn']}: acknowledged without an offset "
                            f"and not found in partition {line['partition']}"
                            for line in missing]
            self.placed = len(placed)
            self._log.close()
