"""Every kind of bad input, sent through the real broker: it lands in the DLQ with its reason
and the original bytes, and the partition keeps flowing (a good message behind it on the
same partition is decided). A raw card number appears nowhere but in the DLQ's copy."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import pytest

from tests.support import stack
from tests.support.factory import (
    auth_message,
    each_followed_by_a_good_one,
    encode,
    with_body_fields,
)
from tests.support.workers import wait_caught_up

PAN = "4111111111111111"


def body_with(**fields: object) -> bytes:
    return with_body_fields("ACC-BAD", **fields)


def literal_amount(text: str) -> bytes:
    return body_with(amount="@@").replace(b'"@@"', text.encode())


def without(field: str) -> bytes:
    message = auth_message(f"BAD-{uuid.uuid4().hex[:10]}", account_id="ACC-BAD")
    del message["body"][field]
    return encode(message)


CASES: dict[str, tuple[bytes, str]] = {
    "invalid json": (b'{"headers": {"message_id": "x"', "INVALID_JSON"),
    "not utf-8": (b'{"headers": "\xff\xfe"}', "INVALID_ENCODING"),
    "duplicate keys": (b'{"headers": {}, "headers": {}, "body": {}}', "INVALID_JSON"),
    "missing transaction_id": (without("transaction_id"), "SCHEMA_VIOLATION"),
    "missing amount": (without("amount"), "SCHEMA_VIOLATION"),
    "amount wrong type": (body_with(amount=[1, 2]), "SCHEMA_VIOLATION"),
    "account_id wrong type": (body_with(account_id=42), "SCHEMA_VIOLATION"),
    "NaN": (literal_amount("NaN"), "INVALID_JSON"),
    "Infinity": (literal_amount("Infinity"), "INVALID_JSON"),
    "1e400": (literal_amount("1e400"), "SCHEMA_VIOLATION"),
    "zero": (literal_amount("0"), "SCHEMA_VIOLATION"),
    "negative": (literal_amount("-12.50"), "SCHEMA_VIOLATION"),
    "too many decimals EUR": (body_with(amount="1.001"), "SCHEMA_VIOLATION"),
    "decimals for JPY": (body_with(amount="100.5", currency="JPY"), "SCHEMA_VIOLATION"),
    "unknown currency": (body_with(currency="ABC"), "SCHEMA_VIOLATION"),
    "lower-case currency": (body_with(currency="eur"), "SCHEMA_VIOLATION"),
    "10,000-character transaction_id": (body_with(transaction_id="T" * 10_000),
                                        "SCHEMA_VIOLATION"),
    "NUL byte": (body_with(merchant="Ama\u0000zon"), "SCHEMA_VIOLATION"),
    "control characters": (body_with(account_id="ACC\u001b[31m"), "SCHEMA_VIOLATION"),
    "above the size limit": (body_with(notes="x" * 100_000), "TOO_LARGE"),
    "unsupported authorization_type": (body_with(authorization_type="CASH_ADVANCE"),
                                       "SCHEMA_VIOLATION"),
    "raw card number": (body_with(card_number=PAN), "CARD_DATA_PRESENT"),
}


@pytest.mark.partitions(1)
def test_bad_input_is_dead_lettered_with_its_reason_and_never_blocks(env, spawn_worker) -> None:
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "1000.00", "EUR")]))
    records, good_after = each_followed_by_a_good_one(CASES, account)
    stack.produce(env.input_topic, records, partition=0)
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    dlq = stack.read_topic(env.dlq_topic, expect=len(CASES))
    by_case = {r.key().decode(): r for r in dlq}
    assert set(by_case) == set(CASES), set(CASES) ^ set(by_case)
    for name, (raw, reason) in CASES.items():
        record = by_case[name]
        headers = dict(record.headers())
        assert headers["error.reason"].decode() == reason, name
        assert headers["error.detail"], name
        assert record.value() == raw, f"{name}: the original bytes, unchanged"
        assert headers["source.topic"].decode() == env.input_topic
        assert int(headers["source.partition"]) == 0 and int(headers["source.offset"]) >= 0

    async def decided() -> list[str]:
        conn = await asyncpg.connect(env.dsn)
        try:
            return [r["txn_id"] for r in await conn.fetch(
                "SELECT txn_id FROM processed_transactions WHERE result = 'APPROVED'")]
        finally:
            await conn.close()

    assert sorted(asyncio.run(decided())) == sorted(good_after)
    m = worker.metrics()
    assert m['payauth_messages_total{outcome="invalid"}'] == len(CASES)
    assert m['payauth_dead_letters_total{reason="CARD_DATA_PRESENT"}'] == 1
    assert worker.terminate() == 0

    # The card number is nowhere but in the DLQ's copy of the original bytes.
    assert PAN not in worker.raw_log()
    for record in dlq:
        for key, value in record.headers():
            assert PAN.encode() not in value, key

    async def anywhere_in_db() -> int:
        conn = await asyncpg.connect(env.dsn)
        try:
            hits = 0
            for table in ("accounts", "ledger_entries", "processed_transactions"):
                hits += await conn.fetchval(
                    f"SELECT count(*) FROM {table} t WHERE t::text LIKE '%' || $1 || '%'", PAN)
            return int(hits)
        finally:
            await conn.close()

    assert asyncio.run(anywhere_in_db()) == 0
    events = stack.read_topic(env.output_topic, expect=len(good_after))
    assert all(PAN.encode() not in e.value() for e in events)
    assert all(json.loads(e.value())["result"] == "APPROVED" for e in events)
