"""Hostile input, as an attacker or a buggy upstream would send it, through the real broker:
no message stops its partition (the good message right behind each one is decided), every
refused one is in the DLQ with its reason, and no card number comes out anywhere: worker
log, DLQ headers, events, metrics, the operator's redrive screen. Then the operator views:
a partition that cannot make progress shows in ``payauth_oldest_unfinished_seconds`` and
``/readyz``; a worker that cannot reach Kafka says so once per interval, in JSON."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support import stack
from tests.support.factory import (
    auth_message,
    each_followed_by_a_good_one,
    encode,
    with_body_fields,
)
from tests.support.workers import payauth, wait_caught_up, wait_until

PAN = "4111111111111111"
FULLWIDTH_PAN = "".join(chr(0xFF10 + int(d)) for d in PAN)


with_body = with_body_fields


def raw_field(account: str, field: bytes) -> bytes:
    """A message with ``field`` (raw JSON bytes) in place of the merchant field."""
    raw = with_body(account, merchant="Amazon.es")
    return raw.replace(b'"merchant": "Amazon.es"', field)


def hostile_cases(account: str) -> dict[str, dict[str, tuple[bytes, str | None]]]:
    """defect → name → (bytes, expected DLQ reason, or None: a valid request, decided)."""
    deep = 300  # orjson writes back at most 254 levels: this crashed the worker, every start
    return {"crash loop": {
        "nesting 300 deep": (raw_field(account, b'"merchant": "Shop", "nest": '
                                       + b"[" * deep + b"]" * deep), None),
    }, "card data passes": {
        "decimal PAN": (raw_field(account, b'"merchant": "Shop", "pan_extra": '
                                  + PAN.encode() + b".0"), "CARD_DATA_PRESENT"),
        "exponent PAN": (raw_field(account, b'"merchant": "Shop", "pan_extra": '
                                   b"4.111111111111111E15"), "CARD_DATA_PRESENT"),
        "dotted PAN": (with_body(account, merchant="4111.1111.1111.1111"), "CARD_DATA_PRESENT"),
        "fullwidth PAN": (with_body(account, merchant=FULLWIDTH_PAN), "CARD_DATA_PRESENT"),
    }, "card data in details": {
        "PAN as currency": (with_body(account, currency=PAN), "CARD_DATA_PRESENT"),
        "PAN as a repeated key": (raw_field(account, b'"' + PAN.encode() + b'": 1, "'
                                            + PAN.encode() + b'": 2, "merchant": "Shop"'),
                                  "INVALID_JSON"),
    }, "inexact amounts": {
        "amount +10.00": (with_body(account, amount="+10.00"), "SCHEMA_VIOLATION"),
        "amount 10.": (with_body(account, amount="10."), "SCHEMA_VIOLATION"),
        "amount .5": (with_body(account, amount=".5"), "SCHEMA_VIOLATION"),
        "amount 1.000…01": (with_body(account, amount="1.0000000000000000000000000000000000001"),
                            "SCHEMA_VIOLATION"),
        "amount 1E-huge": (with_body(account, amount="@@").replace(
            b'"@@"', b"1E-999999999999999999"), "SCHEMA_VIOLATION"),
    }, "unbounded refund": {
        "huge refund": (with_body(account, authorization_type="REFUND",
                                  amount="999999999999999.00"), "LIMIT_EXCEEDED"),
    }, "too large for the DLQ": {
        "1.01 MB": (with_body(account, notes="x" * 1_010_000), "TOO_LARGE"),
        "5 MB": (with_body(account, notes="y" * 5_000_000), "TOO_LARGE"),
    }}


DEFECTS = list(hostile_cases("ACC"))


def produce_large(topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """As a gateway with a large message.max.bytes would: compressed on the wire, so that
    the broker takes records far above its 1 MB limit uncompressed."""
    producer = Producer({"bootstrap.servers": stack.BOOTSTRAP, "enable.idempotence": True,
                         "compression.type": "lz4", "message.max.bytes": 20_000_000,
                         "linger.ms": 5})
    errors: list[Any] = []
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0,
                         on_delivery=lambda err, _m: errors.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors



@pytest.mark.partitions(1)
@pytest.mark.parametrize("defect", DEFECTS)
def test_hostile_messages_never_stop_the_partition_nor_leak_card_data(
        env, spawn_worker, defect: str) -> None:
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "1000.00", "EUR")]))
    cases = hostile_cases(account)[defect]
    records, good_after = each_followed_by_a_good_one(cases, account)
    produce_large(env.input_topic, records)
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions, timeout=120)
    assert worker.alive(), worker.raw_log()[-3000:]

    refused = {name: reason for name, (_raw, reason) in cases.items() if reason}
    dlq = stack.read_topic(env.dlq_topic, expect=len(refused)) if refused else []
    by_case = {r.key().decode(): r for r in dlq}
    assert set(by_case) == set(refused), set(refused) ^ set(by_case)
    for name, reason in refused.items():
        headers = dict(by_case[name].headers())
        assert headers["error.reason"].decode() == reason, (name, headers["error.detail"])
        assert headers["source.offset"] and headers["error.detail"], name
    # Too large for the dead-letter topic: a preview, the size and the hash, and the worker
    # moved on; the original stays on the input topic for redrive.
    large = {"1.01 MB", "5 MB"} & set(cases)
    for name in large:
        original = cases[name][0]
        record = by_case[name]
        headers = dict(record.headers())
        assert headers["original.truncated"] == b"true", name
        assert int(headers["original.size"]) == len(original)
        assert headers["original.sha256"].decode() == hashlib.sha256(original).hexdigest()
        assert record.value() == original[:1024]
    for name in set(refused) - large:
        assert by_case[name].value() == cases[name][0], f"{name}: the original bytes"

    decided = {r["txn_id"]: r["result"] for r in stack.fetch(
        env.dsn, "SELECT txn_id, result FROM processed_transactions")}
    assert all(decided.get(txn) == "APPROVED" for txn in good_after), decided
    valid = len(cases) - len(refused)  # the deeply nested one is a valid request
    assert len(decided) == len(good_after) + valid

    metrics_text = worker.http_get("/metrics")[1]
    status, _ = worker.http_get("/readyz")
    assert status == 200
    wait_until(lambda: worker.metrics().get(
        'payauth_oldest_unfinished_seconds{partition="0"}') == 0, 10, "the age gauge at 0")
    assert worker.terminate() == 0
    log = worker.raw_log()
    assert "batch_failed" not in log and "partition_task_failed" not in log

    # No card number anywhere the service writes, nor on the operator's screen.
    redrive = payauth(env, "dlq", "redrive")
    assert redrive.returncode == 0, redrive.stderr
    assert all(reason in redrive.stdout for reason in refused.values())
    outputs = {"worker log": log, "metrics": metrics_text,
               "redrive screen": redrive.stdout + redrive.stderr,
               "dlq headers": "".join(v.decode("utf-8", "replace") for r in dlq
                                      for _k, v in r.headers())}
    events = stack.read_topic(env.output_topic, expect=len(good_after) + valid)
    outputs["events"] = "".join(e.value().decode() for e in events)
    for where, text in outputs.items():
        for pan in (PAN, FULLWIDTH_PAN, "4111.1111.1111.1111"):
            assert pan not in text, where


@pytest.mark.partitions(1)
def test_a_truncated_dead_letter_is_redriven_from_the_original(env, spawn_worker) -> None:
    big = with_body("ACC-X", notes="z" * 1_200_000)
    produce_large(env.input_topic, [(b"big", big)])
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    [letter] = stack.read_topic(env.dlq_topic, expect=1)
    assert dict(letter.headers())["original.truncated"] == b"true"
    assert worker.terminate() == 0

    dry = payauth(env, "dlq", "redrive", "--reason", "TOO_LARGE")
    assert dry.returncode == 0 and f"original {len(big)} bytes" in dry.stdout, dry.stdout
    done = payauth(env, "dlq", "redrive", "--reason", "TOO_LARGE", "--execute")
    assert done.returncode == 0, done.stderr
    assert "redrove 1 message(s)" in done.stdout
    records = stack.read_topic(env.input_topic, expect=2)
    assert [r.value() for r in records] == [big, big], "the whole original, not the preview"
    assert dict(records[1].headers())["redrive.reason"] == b"TOO_LARGE"


@pytest.mark.partitions(1)
def test_a_partition_that_cannot_progress_shows_its_age_and_fails_readiness(
        env, spawn_worker) -> None:
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    # A bad deploy: the function the worker calls is gone. Not a message's fault: nothing
    # is dead-lettered, the partition waits, and the operator is told.
    stack.fetch(env.dsn, "ALTER FUNCTION payauth_authorize RENAME TO payauth_authorize_away")
    worker = spawn_worker(env, PAYAUTH_STALLED_PARTITION_SECONDS="3")
    worker.wait_assigned()
    stack.produce(env.input_topic, [(account.encode(), encode(auth_message(
        account_id=account, amount="1.00")))], partition=0)

    def stalled() -> bool:
        age = worker.metrics().get('payauth_oldest_unfinished_seconds{partition="0"}', 0)
        return age > 3 and worker.http_get("/readyz")[0] == 503
    wait_until(stalled, 60, "the stalled partition to show")
    assert stack.read_topic(env.dlq_topic) == []
    stack.fetch(env.dsn, "ALTER FUNCTION payauth_authorize_away RENAME TO payauth_authorize")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    wait_until(lambda: worker.http_get("/readyz")[0] == 200, 30, "readiness back")
    wait_until(lambda: worker.metrics().get(
        'payauth_oldest_unfinished_seconds{partition="0"}') == 0, 10, "the age gauge at 0")
    assert worker.terminate() == 0


def test_a_worker_that_cannot_reach_kafka_says_so_in_json_once_per_interval(
        env, spawn_worker) -> None:
    worker = spawn_worker(env, PAYAUTH_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1",
                          PAYAUTH_STALLED_PARTITION_SECONDS="3",
                          PAYAUTH_KAFKA_LOG_INTERVAL_SECONDS="30")
    wait_until(lambda: worker.http_get("/healthz")[0] == 503, 60, "liveness to tell the truth")
    status, why = worker.http_get("/readyz")
    assert status == 503 and "Kafka" in why
    assert "Kafka" in worker.http_get("/healthz")[1]
    assert worker.alive()
    worker.terminate()
    lines = worker.raw_log().splitlines()
    assert lines and all(line.startswith("{") for line in lines), \
        [line for line in lines if not line.startswith("{")][:3]
    kafka_lines = [e for e in worker.logs()
                   if e["event"] in ("kafka_error", "kafka_client_log")]
    assert kafka_lines, "the outage is said"
    # One line per kind per 30 s interval, not hundreds a minute.
    kinds = {(e["event"], e.get("facility"), e.get("error", "")[:20]) for e in kafka_lines}
    assert len(kafka_lines) <= 2 * len(kinds), kafka_lines


def test_no_raw_librdkafka_line_reaches_stderr(tmp_path: Path) -> None:
    """The clients the operator tools build log through the service's logging too."""
    code = ("from service.config import load_settings\n"
            "from service.logs import configure_logging\n"
            "from service.adapters.kafka.config import client_config\n"
            "from confluent_kafka import Producer\n"
            "configure_logging()\n"
            "p = Producer(client_config(load_settings()))\n"
            "p.produce('x', b'v')\n"
            "p.flush(6)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAYAUTH_")}
    env["PAYAUTH_KAFKA_BOOTSTRAP_SERVERS"] = "127.0.0.1:1"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, cwd=stack.ROOT)
    assert "%3|" not in done.stderr and "%4|" not in done.stderr, done.stderr[:500]
    assert "kafka_client_log" in done.stderr
