"""payauth on the secured stack: TLS everywhere, its own credentials, least privilege, and
what each engine must refuse (``make secure-smoke``; see conftest.py)."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]  # re-exported

from service.ops.acls import Acl, bindings
from tests.secure.conftest import SECRETS_FILE, STACK, grant_worker, payauth_as, secrets
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import wait_caught_up, wait_until

# Passwords the tests make up (wrong ones): the final scan looks for these too.
WRONG = f"wrong-{uuid.uuid4().hex}"


def seed(world: stack.Env, n: int) -> list[str]:
    accounts = [f"ACC-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    asyncio.run(stack.seed_accounts(world.dsn, [(a, "100000.00", "EUR") for a in accounts]))
    return accounts


def stream(world: stack.Env, accounts: list[str], n: int,
           duplicates: int = 0) -> list[str]:
    txns = [f"SEC-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    records = [(accounts[i % len(accounts)],
                encode(auth_message(t, account_id=accounts[i % len(accounts)])))
               for i, t in enumerate(txns)]
    stack.produce(world.input_topic, records + records[:duplicates])
    return txns


def ledger_counts(world: stack.Env) -> dict[str, int]:
    rows = stack.fetch(world.dsn, "SELECT txn_id, count(*) AS n FROM ledger_entries "
                                  "GROUP BY txn_id")
    return {r["txn_id"]: r["n"] for r in rows}


def kafka_refuses(conf: dict[str, Any]) -> bool:
    try:
        AdminClient({**conf, "log_level": 0}).list_topics(timeout=8)  # its lines: not news
    except KafkaException:
        return True
    return False


def readyz(worker: Any) -> tuple[int, str]:
    status, body = worker.http_get("/readyz")
    return int(status), str(body)


# ------------------------------------------------------------------ the main job
def test_a_stream_with_duplicates_is_decided_once_with_the_worker_settings_only(
        env: stack.Env, spawn_worker: Any) -> None:
    accounts = seed(env, 4)
    txns = stream(env, accounts, 80, duplicates=20)
    workers = [spawn_worker(env, "a"), spawn_worker(env, "b")]
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert ledger_counts(env) == dict.fromkeys(txns, 1)
    events = stack.events_of(stack.read_topic(env.output_topic, expect=100))
    assert {e["transaction_id"] for e in events} == set(txns)
    assert all(e["result"] == "APPROVED" for e in events)
    metrics = [w.metrics() for w in workers]
    assert sum(m.get('payauth_messages_total{outcome="approved"}', 0) for m in metrics) == 80
    wait_until(lambda: sum(w.metrics().get('payauth_messages_total{outcome="duplicate"}', 0)
                           for w in workers) == 20, 30, "the 20 redeliveries counted")
    assert all(m["payauth_redis_up"] == 1 for m in metrics)  # the worker's Redis ACL user
    assert all(readyz(w)[0] == 200 for w in workers)
    assert all(w.terminate() == 0 for w in workers)


# ------------------------------------------------------------------ refusals
def test_a_plaintext_client_is_refused_by_each_engine(worker_settings: dict[str, str],
                                                      live_stack: None) -> None:
    assert kafka_refuses({"bootstrap.servers": "localhost:29092"})

    async def postgres() -> None:
        await asyncpg.connect(worker_settings["PAYAUTH_DATABASE_URL"].split("?")[0]
                              + "?sslmode=disable", timeout=10)
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="no encryption"):
        asyncio.run(postgres())

    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="localhost", port=36379, socket_timeout=3,
                    socket_connect_timeout=3).ping()


def test_a_wrong_password_is_refused_by_each_engine(
        env: stack.Env, worker_settings: dict[str, str], spawn_worker: Any) -> None:
    kafka = {**stack.kafka_conf(), "sasl.username": "worker", "sasl.password": WRONG}
    assert kafka_refuses(kafka)

    pg_url = stack.with_database(worker_settings["PAYAUTH_DATABASE_URL"], env.database)
    wrong_pg = pg_url.replace(pg_url.split("//")[1].split("@")[0],
                              f"payauth_app:{WRONG}")
    with pytest.raises(asyncpg.InvalidPasswordError):
        asyncio.run(asyncpg.connect(wrong_pg, timeout=10))

    wrong_redis = worker_settings["PAYAUTH_REDIS_URL"].replace(
        worker_settings["PAYAUTH_REDIS_URL"].split("//")[1].split("@")[0],
        f"payauth-worker:{WRONG}")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(wrong_redis, socket_timeout=3).ping()

    # A worker with a wrong database password: not ready, the refusal named, retrying.
    worker = spawn_worker(env, "wrong-pg", PAYAUTH_DATABASE_URL=wrong_pg,
                          PAYAUTH_KAFKA_LOG_INTERVAL_SECONDS="2")
    wait_until(lambda: "postgres refused" in readyz(worker)[1], 60, "readyz naming postgres")
    status, body = readyz(worker)
    assert status == 503 and "InvalidPasswordError" in body
    wait_until(lambda: len(worker.events("engine_refused")) >= 2, 30,
               "the refusal repeated once per interval")
    assert worker.alive()

    # A worker with a wrong Kafka password: the same, for its broker connection.
    kafka_worker = spawn_worker(env, "wrong-kafka", PAYAUTH_KAFKA_SASL_PASSWORD=WRONG)
    wait_until(lambda: "kafka connection refused" in readyz(kafka_worker)[1], 90,
               "readyz naming the broker's refusal")
    status, body = readyz(kafka_worker)
    assert status == 503 and "authentication" in body.lower(), body
    assert kafka_worker.alive()

    # And a wrong Redis password: Redis is optional when away, not when it refuses us.
    redis_worker = spawn_worker(env, "wrong-redis", PAYAUTH_REDIS_URL=wrong_redis)
    wait_until(lambda: "redis refused" in readyz(redis_worker)[1], 90,
               "readyz naming Redis's refusal")
    assert "AuthenticationError" in readyz(redis_worker)[1]


def test_the_worker_login_may_not_change_the_ledger(
        env: stack.Env, worker_settings: dict[str, str], spawn_worker: Any) -> None:
    accounts = seed(env, 1)
    stream(env, accounts, 3)
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.terminate() == 0

    async def tamper() -> list[type[BaseException]]:
        conn = await asyncpg.connect(
            stack.with_database(worker_settings["PAYAUTH_DATABASE_URL"], env.database))
        refused = []
        try:
            for sql in ("UPDATE ledger_entries SET amount = 0",
                        "DELETE FROM ledger_entries",
                        "INSERT INTO accounts (account_id, balance, opening_balance, currency, "
                        "status) VALUES ('ACC-X', 1, 1, 'EUR', 'ACTIVE')",
                        "CREATE TABLE sneaky (x int)"):
                try:
                    await conn.execute(sql)
                except asyncpg.InsufficientPrivilegeError as exc:
                    refused.append(type(exc))
        finally:
            await conn.close()
        return refused

    assert asyncio.run(tamper()) == [asyncpg.InsufficientPrivilegeError] * 4
    assert sorted(ledger_counts(env).values()) == [1, 1, 1]


def test_a_worker_of_a_group_without_acls_waits_named_and_goes_on_once_granted(
        env: stack.Env, admin_settings: dict[str, str], spawn_worker: Any,
        tier_logs: Path) -> None:
    world = replace(env, group_id=f"{env.group_id}-other")  # the topics' ACLs, not the group's
    accounts = seed(world, 2)
    txns = stream(world, accounts, 10)
    worker = spawn_worker(world, "no-group-acl", PAYAUTH_KAFKA_LOG_INTERVAL_SECONDS="2")
    wait_until(lambda: "kafka consumer refused" in readyz(worker)[1], 90,
               "readyz naming the group's refusal")
    status, body = readyz(worker)
    assert status == 503 and "group authorization failed" in body.lower(), body
    wait_until(lambda: len(worker.events("engine_refused")) >= 2, 30,
               "the refusal repeated once per interval")
    refusal = worker.events("engine_refused")[0]
    assert refusal["source"] == "kafka consumer"
    assert "group authorization failed" in refusal["reason"].lower()
    assert ledger_counts(world) == {}  # nothing consumed
    assert all(o < 0 for o in stack.committed_offsets(
        world.group_id, world.input_topic, world.partitions).values())

    pid = worker.proc.pid
    grant_worker(admin_settings, world, tier_logs)
    wait_caught_up(world.group_id, world.input_topic, world.partitions)
    assert ledger_counts(world) == dict.fromkeys(txns, 1)
    wait_until(lambda: readyz(worker)[0] == 200, 30, "ready once granted")
    assert worker.alive() and worker.proc.pid == pid  # no restart
    assert worker.events("engine_accepted")
    assert worker.terminate() == 0


def test_a_worker_whose_ca_does_not_match_is_refused_not_downgraded(
        env: stack.Env, worker_settings: dict[str, str], spawn_worker: Any,
        other_ca: Path) -> None:
    ca = worker_settings["PAYAUTH_KAFKA_SSL_CA_LOCATION"]  # the CA every setting names
    assert all(ca in worker_settings[k] for k in ("PAYAUTH_DATABASE_URL", "PAYAUTH_REDIS_URL"))
    assert kafka_refuses({**stack.kafka_conf(), "ssl.ca.location": str(other_ca)})

    pg_url = stack.with_database(worker_settings["PAYAUTH_DATABASE_URL"], env.database)
    for mode in ("verify-full", "verify-ca", "require"):
        untrusted = pg_url.replace(ca, str(other_ca)).replace("verify-full", mode)
        # A TLS failure, not pg_hba's "no encryption": asyncpg did not try again without TLS.
        with pytest.raises(ssl.SSLCertVerificationError):
            asyncio.run(asyncpg.connect(untrusted, timeout=10))

    with pytest.raises(redis.ConnectionError) as info:
        redis.Redis.from_url(worker_settings["PAYAUTH_REDIS_URL"].replace(ca, str(other_ca)),
                             socket_timeout=3).ping()
    assert "certificate verify failed" in str(info.value).lower()

    settings = {k: v.replace(ca, str(other_ca)) for k, v in worker_settings.items()}
    settings["PAYAUTH_DATABASE_URL"] = pg_url.replace(ca, str(other_ca))
    worker = spawn_worker(env, "other-ca", **settings)
    wait_until(lambda: "postgres refused" in readyz(worker)[1], 60, "readyz naming postgres")
    assert "SSLCertVerificationError" in readyz(worker)[1]
    assert worker.alive()


def test_a_principal_without_acls_waits_at_each_missing_one_and_loses_nothing(
        env: stack.Env, spawn_worker: Any) -> None:
    """The second worker principal, given no ACL: first the dead-letter topic's
    DescribeConfigs is refused (the worker waits at start, not guessing a size limit), then,
    granted all but Write on the output topic, every batch's publication is refused; once
    allowed to write, it publishes what it decided, each transaction once, without a
    restart. (With no Write on any topic, the idempotent producer's InitProducerId would be
    refused, which librdkafka makes fatal: the worker stops, see the next test.)"""
    principal = "User:outsider"
    accounts = seed(env, 2)
    txns = stream(env, accounts, 10)
    worker = spawn_worker(env, "outsider", PAYAUTH_KAFKA_SASL_USERNAME="outsider",
                          PAYAUTH_KAFKA_SASL_PASSWORD=secret_named("kafka_outsider"),
                          PAYAUTH_KAFKA_LOG_INTERVAL_SECONDS="2",
                          PAYAUTH_RETRY_BACKOFF_MAX_MS="1000")
    wait_until(lambda: "kafka dead-letter topic refused" in readyz(worker)[1], 60,
               "readyz naming the missing DescribeConfigs")
    assert f"DescribeConfigs on topic {env.dlq_topic}" in readyz(worker)[1]

    allow(principal, [Acl("topic", env.dlq_topic, "DescribeConfigs"),
                      Acl("topic", env.dlq_topic, "Write"),
                      Acl("topic", env.input_topic, "Read"), Acl("group", env.group_id, "Read")])
    wait_until(lambda: "kafka producer refused" in readyz(worker)[1], 90,
               "readyz naming the refused publication")
    assert f"(topic {env.output_topic})" in readyz(worker)[1]
    assert stack.read_topic(env.output_topic) == []

    allow(principal, [Acl("topic", env.output_topic, "Write")])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert ledger_counts(env) == dict.fromkeys(txns, 1)
    events = stack.events_of(stack.read_topic(env.output_topic, expect=10))
    assert sorted(e["transaction_id"] for e in events) == sorted(txns)
    wait_until(lambda: readyz(worker)[0] == 200, 30, "ready once allowed")
    assert worker.terminate() == 0


def test_a_principal_that_may_write_no_topic_stops_the_worker(
        env: stack.Env, spawn_worker: Any) -> None:
    """Kafka refuses its idempotent producer a producer id; librdkafka makes that fatal, so
    the worker stops with exit code 1 (the orchestrator restarts it, with backoff) instead
    of looking alive with a producer that can never send."""
    allow("User:outsider", [Acl("topic", env.dlq_topic, "DescribeConfigs"),
                            Acl("topic", env.input_topic, "Read"),
                            Acl("group", env.group_id, "Read")])
    stream(env, seed(env, 1), 3)
    worker = spawn_worker(env, "no-write", PAYAUTH_KAFKA_SASL_USERNAME="outsider",
                          PAYAUTH_KAFKA_SASL_PASSWORD=secret_named("kafka_outsider"))
    assert worker.wait_exit(120) == 1
    fatal = worker.events("kafka_fatal_error")
    assert fatal and "authorization" in fatal[0]["error"].lower(), worker.raw_log()[-3000:]
    assert all(n == 1 for n in ledger_counts(env).values())  # whatever it decided, once


def secret_named(name: str) -> str:
    return next(line.split("=", 1)[1] for line in SECRETS_FILE.read_text().splitlines()
                if line.startswith(f"{name}="))


def allow(principal: str, acls: list[Acl]) -> None:
    admin = AdminClient(stack.kafka_conf())
    for future in admin.create_acls(bindings(acls, principal), request_timeout=30).values():
        future.result()


# ------------------------------------------------------------- operator commands
def test_operator_commands_with_the_worker_or_the_administrator_settings(
        env: stack.Env, worker_settings: dict[str, str], admin_settings: dict[str, str],
        spawn_worker: Any, tier_logs: Path) -> None:
    accounts = seed(env, 1)
    txns = stream(env, accounts, 5)
    stack.produce(env.input_topic, [(accounts[0], b"{not json")])  # a dead letter
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.terminate() == 0

    shown = payauth_as(worker_settings, env, tier_logs, "explain", txns[0])
    assert shown.returncode == 0 and "decision     APPROVED" in shown.stdout, shown.stderr
    replay = payauth_as(worker_settings, env, tier_logs, "replay", "--to-earliest")
    assert replay.returncode == 0 and "dry run" in replay.stdout, replay.stderr
    redrive = payauth_as(admin_settings, env, tier_logs, "dlq", "redrive")
    assert redrive.returncode == 0 and "would redrive" in redrive.stdout, redrive.stderr
    printed = payauth_as(admin_settings, env, tier_logs, "acls", "--principal", "User:worker")
    assert printed.returncode == 0 and f"Read on topic {env.input_topic}" in printed.stdout


# ------------------------------------------------------------------ the last test
def test_no_secret_in_any_log_the_tier_wrote(live_stack: None, tier_logs: Path) -> None:
    logs = [p for p in tier_logs.iterdir() if p.is_file()]
    # The engines' own logs too: what they say about our connections.
    logs += [p for p in (STACK / "secure" / "kafka" / "logs").glob("*.log")]
    logs += [p for p in (STACK / "secure" / "redis").glob("*.log")]
    assert len([p for p in logs if p.parent == tier_logs]) >= 5, "the tier wrote no logs"
    assert (tier_logs / "commands.log").stat().st_size > 0
    for secret in [*secrets(), WRONG]:
        leaks = [p.name for p in logs if secret in p.read_text(errors="replace")]
        assert leaks == [], f"a secret appears in {leaks}"
