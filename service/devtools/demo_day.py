"""The demo's issuer's day: one message of each kind of an issuer's day (a verification, a
balance inquiry asked again after a purchase, a partial approval, a hotel hold with two
increments, a purchase abroad, a split shipment, a clearing before its advice) on two
accounts of its own, then the card controls on a third (a frozen card, an expired card, a
blocked merchant category, a daily limit reached and the next day's purchase approved), the
event fields each should publish, and the table that shows them expected against
observed."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from service.config import Settings
from service.devtools.network_message import authorization_message
from service.logs import librdkafka_logger

# (what it shows, its transaction, the event fields it should carry)
DayRow = tuple[str, str, dict[str, Any]]
# DemoStream._add: (key, message, expected outcome, late) -> the record's bytes
Add = Callable[..., bytes]


def day_accounts(run: str) -> tuple[str, str]:
    """The accounts of the issuer's day: one with 1,000.00 EUR, one with 80.00 EUR."""
    return f"DAY-{run}", f"DAY-{run}-small"


def card_controls_setup(run: str) -> tuple[str, list[str]]:
    """The card controls' account (1,000.00 EUR, seeded with the day's) and the SQL that
    gives it its cards, its card's daily limit of 100.00 and a blocked category."""
    acc = f"DAY-{run}-cards"
    return acc, [
        f"INSERT INTO cards (card_id, account_id, status, expires_on) VALUES "
        f"('{run}-CARD', '{acc}', 'ACTIVE', '2030-12-31'), "
        f"('{run}-FROZEN', '{acc}', 'FROZEN', NULL), "
        f"('{run}-OLD', '{acc}', 'ACTIVE', '2026-03-31')",
        f"INSERT INTO spending_limits (limit_id, scope, scope_id, period, max_amount) VALUES "
        f"('{run}-DAILY', 'CARD', '{run}-CARD', 'DAY', 100.00)",
        f"INSERT INTO card_blocks (scope, scope_id, kind, value) VALUES "
        f"('CARD', '{run}-CARD', 'CATEGORY', '7995')",
    ]


def card_controls(run: str, next_txn: Callable[[], str], add: Add) -> list[DayRow]:
    """Adds the card controls' messages through ``add`` (their own times: two days of
    April); returns what each should publish."""
    acc, _ = card_controls_setup(run)
    rows: list[DayRow] = []

    def send(label: str, card: str, amount: str, at: str, expect: dict[str, Any],
             **fields: Any) -> None:
        txn = next_txn()
        message = authorization_message(txn, account_id=acc, amount=amount, card_id=card,
                                        **fields)
        message["headers"]["timestamp"] = at
        add(acc, message, "approved" if expect.get("result") == "APPROVED" else "declined")
        rows.append((label, txn, expect))

    send("frozen card", f"{run}-FROZEN", "10.00", "2026-04-07T09:00:00Z",
         {"decline_reason": "CARD_BLOCKED", "card_status": "FROZEN"})
    send("expired card (March 2026)", f"{run}-OLD", "10.00", "2026-04-07T09:05:00Z",
         {"decline_reason": "CARD_EXPIRED"})
    send("blocked category (7995)", f"{run}-CARD", "10.00", "2026-04-07T09:10:00Z",
         {"decline_reason": "CATEGORY_BLOCKED"}, merchant_category="7995")
    send("daily limit 100.00: 70.00", f"{run}-CARD", "70.00", "2026-04-07T10:00:00Z",
         {"result": "APPROVED"})
    send("  then 40.00 the same day", f"{run}-CARD", "40.00", "2026-04-07T23:59:59Z",
         {"decline_reason": "LIMIT_EXCEEDED", "limit_id": f"{run}-DAILY"})
    send("  40.00 the next day", f"{run}-CARD", "40.00", "2026-04-08T00:00:01Z",
         {"result": "APPROVED"})
    return rows


def issuers_day(run: str, next_txn: Callable[[], str], add: Add) -> list[DayRow]:
    """Adds the day's messages through ``add``; returns what each should publish."""
    acc, small = day_accounts(run)
    day: list[DayRow] = []

    def send(label: str, kind: str, amount: str, expect: dict[str, Any],
             original: str | None = None, account: str = acc, **fields: Any) -> str:
        txn = next_txn()
        extra = {} if original is None else {"original_transaction_id": original}
        add(account, authorization_message(txn, account_id=account, amount=amount,
                                           authorization_type=kind, **extra, **fields),
            "approved")
        if label:
            day.append((label, txn, expect))
        return txn

    send("verification", "VERIFICATION", "0.00", {"result": "APPROVED", "balance_delta": "0.00"})
    inquiry = authorization_message(next_txn(), account_id=acc, amount="0.00",
                                    authorization_type="BALANCE_INQUIRY")
    add(acc, inquiry, "approved")
    day.append(("balance inquiry", inquiry["body"]["transaction_id"],
                {"ledger_balance": "1000.00", "available_balance": "1000.00"}))
    send("", "PURCHASE", "120.00", {})  # the balance moves
    again = {**inquiry, "headers": {**inquiry["headers"], "message_id": "again-"
                                    + inquiry["headers"]["message_id"]}}
    add(acc, again, "duplicate", late=True)  # answers its first figures
    day.append(("  asked again, after a purchase", inquiry["body"]["transaction_id"],
                {"ledger_balance": "1000.00"}))
    send("partial approval (asked 120.00)", "PURCHASE", "120.00",
         {"amount_approved": "80.00", "partial": True}, account=small,
         partial_approval_supported=True)
    hotel = send("hotel hold", "AUTHORIZATION", "200.00", {"held_delta": "200.00"})
    send("  first increment", "INCREMENTAL", "50.00", {"held_delta": "50.00"}, hotel)
    send("  second increment", "INCREMENTAL", "30.00", {"held_delta": "30.00"}, hotel)
    send("  final clearing", "CLEARING", "265.00",
         {"held_delta": "-280.00", "balance_delta": "-265.00"}, hotel)
    send("purchase abroad (100.00 USD)", "PURCHASE", "100.00",
         {"amount_approved": "92.37", "balance_delta": "-92.37"}, currency="USD",
         billing_amount="92.37", billing_currency="EUR")
    parcel = send("split shipment: hold", "AUTHORIZATION", "90.00", {"held_delta": "90.00"})
    send("  first parcel cleared", "CLEARING", "40.00",
         {"final": False, "held_delta": "-40.00"}, parcel, final=False)
    send("  last parcel cleared", "CLEARING", "50.00",
         {"final": True, "held_delta": "-50.00"}, parcel)
    advice = f"DEMO-{run}-stand-in"
    send("clearing before its advice", "CLEARING", "25.00",
         {"forced": True, "balance_delta": "-25.00"}, advice)
    add(acc, authorization_message(advice, account_id=acc, amount="25.00",
                                   authorization_type="ADVICE"), "approved", late=True)
    day.append(("  the advice, after it", advice,
                {"amount_already_cleared": "25.00", "held_delta": "0.00"}))
    return day + card_controls(run, next_txn, add)


def day_events(settings: Settings, txns: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The events published for these transactions (their decisions' own), in order."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "group.id": f"demo-day-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "enable.partition.eof": True,
                         "logger": librdkafka_logger(level=logging.ERROR)})
    found: dict[str, list[dict[str, Any]]] = {}
    try:
        topic = settings.output_topic
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        ended: set[int] = set()
        deadline = time.monotonic() + 60
        while len(ended) < len(partitions) and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=1.0):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        ended.add(msg.partition() or 0)
                    continue
                event = json.loads(msg.value() or b"{}")
                if event.get("transaction_id") in txns and event["event_type"] not in (
                        "ReversalApplied", "HoldExpired"):
                    found.setdefault(event["transaction_id"], []).append(event)
    finally:
        consumer.close()
    return found


def print_day(day: list[DayRow], observed: dict[str, list[dict[str, Any]]]) -> bool:
    """The day's table, expected against observed; whether every field agrees (and every
    copy of an event is the same: an inquiry's redelivery answers its first figures)."""
    agrees_all = True
    print()
    print(f"{'an issuer’s day':<30}{'expected':>32}{'observed':>32}")
    print("-" * 94)
    for label, txn, fields in day:
        copies = observed.get(txn, [])
        first: dict[str, Any] = copies[0] if copies else {}
        same = all(e == first for e in copies)
        for i, (field, want) in enumerate(fields.items()):
            got_value = first.get(field, "none")
            agrees = got_value == want and same
            agrees_all &= agrees
            print(f"{label if i == 0 else '':<30}{f'{field} {_shown(want)}':>32}"
                  f"{field + ' ' + _shown(got_value):>32}"
                  f"{'' if agrees else '   <-- MISMATCH'}")
    return agrees_all


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
