"""Three workers of the image in one consumer group, as users deploy them, against the local
stack: a stream with duplicates of every kind and bad input flows while one container is
stopped (SIGTERM: it finishes, commits, leaves the group within its grace period) and
another is killed (SIGKILL: its partitions move). Every transaction is decided once, none
is lost; checked in the database, on the output and dead-letter topics, and by
``payauth verify`` run from the image."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter, defaultdict
from decimal import Decimal
from typing import Any

import pytest

from tests.support import stack
from tests.support.containers import (
    Container,
    Engine,
    container_env,
    group_members,
    run_once,
    stable_with,
    with_port,
)
from tests.support.factory import auth_message, encode
from tests.support.workers import wait_caught_up, wait_until

PARTITIONS = 6
ACCOUNTS = 12
TRANSACTIONS = 3000
OPENING = Decimal("1000000.00")


class Stream:
    """The records to send (key, value, partition) and what each should become. Each
    account's records go to one partition, in order, as the gateway's partitioner does."""

    def __init__(self, run: str) -> None:
        self.accounts = [f"ACC-{run}-{i:02d}" for i in range(ACCOUNTS)]
        self.records: list[tuple[str, bytes, int]] = []
        self.approved: dict[str, tuple[str, Decimal]] = {}
        self.declined: set[str] = set()
        self.invalid = 0
        self.conflicts = 0
        self.duplicates: Counter[str] = Counter()
        late: list[tuple[str, bytes, int]] = []
        for i in range(TRANSACTIONS):
            txn = f"TXN-{run}-{i:05d}"
            index = i % ACCOUNTS
            account, home = self.accounts[index], index % PARTITIONS
            if i % 97 == 13:  # an account nobody has: declined
                account = f"GHOST-{run}-{i}"
                self.declined.add(txn)
            amount = Decimal(f"{i % 40 + 1}.{i % 100:02d}")
            message = auth_message(txn, account_id=account, amount=str(amount))
            raw = encode(message)
            self.records.append((account, raw, home))
            if txn not in self.declined:
                self.approved[txn] = (account, amount)
            if i % 10 == 1:  # the broker redelivers the very same message
                self.records.append((account, raw, home))
                self.duplicates["redelivery"] += 1
            elif i % 10 == 3:  # the network's producer retries with a new message_id
                retry = {**message, "headers": {**message["headers"],
                                                "message_id": f"retry-{uuid.uuid4().hex}"}}
                self.records.append((account, encode(retry), home))
                self.duplicates["producer_retry"] += 1
            elif i % 10 == 5:  # the same transaction on another partition
                self.records.append((account, raw, (home + 1) % PARTITIONS))
                self.duplicates["cross_partition"] += 1
            elif i % 10 == 7:  # redelivered later, long after it was decided
                late.append((account, raw, home))
                self.duplicates["late"] += 1
            if i % 250 == 100:  # bad input: broken JSON, a non-finite amount
                self.records.append((account, b'{"headers": {"message_id": "broken"', home))
                nan = auth_message(f"BAD-{run}-{i}", account_id=account, amount="1.00")
                nan["body"]["amount"] = "NaN"
                self.records.append((account, encode(nan), home))
                self.invalid += 2
            if i % 500 == 250 and txn in self.approved:  # the same key, another amount
                conflict = auth_message(txn, account_id=account, amount="999.99")
                late.append((account, encode(conflict), home))
                self.conflicts += 1
        self.records += late

    @property
    def decided(self) -> set[str]:
        return set(self.approved) | self.declined


def produce_slowly(topic: str, records: list[tuple[str, bytes, int]], per_second: float,
                   failures: list[BaseException]) -> threading.Thread:
    """Send the stream at a bounded rate in the background, so that the stop and the kill
    happen while it flows; every record acknowledged."""
    def send() -> None:
        try:
            producer = stack.producer()
            errors: list[Any] = []
            chunk = max(1, int(per_second / 10))
            for start in range(0, len(records), chunk):
                for key, value, partition in records[start:start + chunk]:
                    producer.produce(topic, key=key, value=value, partition=partition,
                                     on_delivery=lambda err, _m: errors.append(err) if err
                                     else None)
                producer.poll(0)
                time.sleep(0.1)
            assert producer.flush(30) == 0, "producer did not flush"
            assert not errors, f"delivery failed: {errors[:3]}"
        except BaseException as exc:
            failures.append(exc)

    return threading.Thread(target=send, daemon=True)


def decided_in_logs(container: Container) -> list[dict[str, Any]]:
    return [d for e in container.events("decided") for d in e["decisions"]]


def processed(env: stack.Env) -> int:
    return int(stack.fetch(env.dsn, "SELECT count(*) AS n FROM processed_transactions")[0]["n"])


@pytest.mark.partitions(PARTITIONS)
def test_three_workers_one_stopped_one_killed_decide_everything_once(
        env: stack.Env, engine: Engine, containers) -> None:
    run = uuid.uuid4().hex[:8]
    stream = Stream(run)
    asyncio.run(stack.seed_accounts(env.dsn, [(a, OPENING, "EUR") for a in stream.accounts]))

    # Dynamic membership (no instance id): a clean stop leaves the group at once.
    settings = container_env(env, PAYAUTH_LOG_LEVEL="INFO", PAYAUTH_SHUTDOWN_TIMEOUT_SECONDS="20")
    workers = [containers(with_port(settings), grace_seconds=30) for _ in range(3)]
    wait_until(lambda: stable_with(env.group_id, 3, PARTITIONS), 120,
               "three members sharing the partitions")
    for worker in workers:
        wait_until(lambda w=worker: w.http_get("/readyz")[0] == 200, 60, f"{worker.name} ready")

    # The stream in three parts; each stop or kill is sent while a part is on its way (so
    # it is mid-stream however fast the workers are here), once the part before is being
    # decided.
    third = len(stream.records) // 3
    parts = [stream.records[:third], stream.records[third:2 * third],
             stream.records[2 * third:]]
    failures: list[BaseException] = []

    def send(part: list[tuple[str, bytes, int]]) -> threading.Thread:
        thread = produce_slowly(env.input_topic, part, per_second=300, failures=failures)
        thread.start()
        return thread

    stopped, killed, survivor = workers
    send(parts[0]).join(timeout=120)
    wait_until(lambda: processed(env) >= 300, 120, "the stream to be decided")

    # SIGTERM mid-stream: in-flight batches finish, offsets commit, the member leaves.
    sender = send(parts[1])
    owned = dict(group_members(env.group_id))[f"payauth-{stopped.name}"]
    assert owned, "the container to stop owns no partition"
    began = time.monotonic()
    assert stopped.stop() == 0, f"not a clean exit within the grace period:\n" \
                                f"{stopped.raw_logs()[-3000:]}"
    stop_seconds = time.monotonic() - began
    committed = stack.committed_offsets(env.group_id, env.input_topic, PARTITIONS)
    wait_until(lambda: stable_with(env.group_id, 2, PARTITIONS), 60,
               "the two others to take its partitions")
    rebalance_seconds = time.monotonic() - began
    print(f"\n[containers] stop took {stop_seconds:.1f} s; stop to rebalance "
          f"{rebalance_seconds:.1f} s")
    assert [e["exit_code"] for e in stopped.events("worker_stopped")] == [0]
    assert stopped.events("consumer_closed"), "the consumer did not close (leave the group)"
    assert not stopped.events("stop_drain_timeout")
    # what it decided is committed: a new owner does not read it again
    for decision in decided_in_logs(stopped):
        if decision["partition"] in owned:
            assert committed[decision["partition"]] > decision["offset"], decision

    # SIGKILL mid-stream: nothing runs its shutdown; the session times out, partitions move.
    sender.join(timeout=120)
    wait_until(lambda: processed(env) >= 1200, 180, "more of the stream to be decided")
    sender = send(parts[2])
    assert killed.kill() == 137
    wait_until(lambda: stable_with(env.group_id, 1, PARTITIONS), 90,
               "the survivor to own every partition")

    sender.join(timeout=120)
    assert not sender.is_alive() and not failures, failures
    wait_caught_up(env.group_id, env.input_topic, PARTITIONS, timeout=300)
    assert survivor.running()

    # Nothing decided twice: across the three containers' logs each transaction at most
    # once; and in the database exactly once, all of them.
    logged = Counter(d["transaction_id"] for w in workers for d in decided_in_logs(w))
    assert [t for t, n in logged.items() if n > 1] == []
    rows = stack.fetch(env.dsn, "SELECT txn_id, result FROM processed_transactions")
    results = {r["txn_id"]: r["result"] for r in rows}
    assert set(results) == stream.decided
    assert {t for t, r in results.items() if r == "DECLINED"} == stream.declined
    ledger = stack.fetch(env.dsn, "SELECT txn_id, account_id, amount FROM ledger_entries")
    assert len(ledger) == len(stream.approved)
    assert {r["txn_id"]: (r["account_id"], -r["amount"]) for r in ledger} == stream.approved
    spent: dict[str, Decimal] = defaultdict(Decimal)
    for account, amount in stream.approved.values():
        spent[account] += amount
    balances = stack.fetch(env.dsn, "SELECT account_id, balance FROM accounts")
    assert {r["account_id"]: r["balance"] for r in balances} == \
        {a: OPENING - spent[a] for a in stream.accounts}

    # On the topics: one event_id per decided transaction (a republication repeats it),
    # every invalid record and conflict dead-lettered (a kill may repeat one: count by
    # source position).
    events = stack.events_of(stack.read_topic(env.output_topic, timeout=60))
    ids: dict[str, set[str]] = defaultdict(set)
    for event in events:
        ids[event["transaction_id"]].add(event["event_id"])
    assert set(ids) == stream.decided
    assert all(len(v) == 1 for v in ids.values())
    dlq = stack.read_topic(env.dlq_topic, timeout=60)
    by_source = {(dict(r.headers())["source.partition"], dict(r.headers())["source.offset"]):
                 dict(r.headers())["error.reason"].decode() for r in dlq}
    reasons = Counter(by_source.values())
    assert reasons["IDEMPOTENCY_KEY_CONFLICT"] == stream.conflicts
    assert sum(reasons.values()) == stream.invalid + stream.conflicts

    # the duplicates were seen as such by the workers that met them
    metrics = survivor.http_get("/metrics")[1]
    assert 'payauth_duplicates_total{' in metrics

    verified = run_once(engine, container_env(env), "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert survivor.stop() == 0
