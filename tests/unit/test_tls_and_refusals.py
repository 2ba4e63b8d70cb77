"""What the secured deployment relies on, without an engine: no URL that could fall back to
plaintext, TLS settings reaching every Redis connection (the Sentinels' too), refusals named
by /readyz, and secrets masked in every log line. (The worker's ACL list:
tests/unit/ops/test_acls.py.)"""

from __future__ import annotations

import json

import pytest
import structlog

from service.adapters.redis_cache import master_options, sentinel_options
from service.config import ConfigError, database_plaintext, load_settings
from service.health import Health
from service.logs import configure_logging

pytestmark = pytest.mark.usefixtures("clean_payauth_env")


@pytest.mark.parametrize("url", [
    "postgresql://u:pw@db.internal:5432/payauth",
    "postgresql://u:pw@db.internal:5432/payauth?sslmode=prefer",
    "postgresql://u:pw@db.internal:5432/payauth?sslmode=allow",
    "postgresql://u:pw@localhost:5432,10.0.0.7:5432/payauth",
    "postgresql://u:pw@[2001:db8::1]:5432/payauth",
    "postgresql://u:pw@/payauth?host=db.internal",
])
def test_a_url_that_could_fall_back_to_plaintext_is_refused(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(database_url=url)
    assert "PAYAUTH_DATABASE_URL" in str(info.value) and "sslmode=verify-full" in str(info.value)
    assert "pw" not in str(info.value).replace("payauth", "")


@pytest.mark.parametrize("url", [
    "postgresql://localhost:5432/payauth",  # the local stacks: loopback only
    "postgresql://u:pw@127.0.0.1:5432/payauth",
    "postgresql://u:pw@[::1]:5432/payauth",
    "postgresql://u:pw@/payauth?host=/var/run/postgresql",
    "postgresql://u:pw@db.internal:5432/payauth?sslmode=verify-full&sslrootcert=/ca.pem",
    "postgresql://u:pw@db-a:5432,db-b:5432/payauth?sslmode=verify-ca&sslrootcert=/ca.pem",
    "postgresql://u:pw@db.internal:5432/payauth?sslmode=require",
])
def test_a_url_that_keeps_tls_or_stays_on_the_host_is_accepted(url: str) -> None:
    assert load_settings(database_url=url).database_url.get_secret_value() == url
    assert not database_plaintext(url)


def test_plaintext_by_choice_is_accepted_and_said() -> None:
    """sslmode=disable is no fallback (the compose system's one Docker network): accepted,
    and the worker logs postgres_without_tls at start."""
    url = "postgresql://u:pw@postgres:5432/payauth?sslmode=disable"
    load_settings(database_url=url)
    assert database_plaintext(url)
    assert not database_plaintext("postgresql://u:pw@localhost/payauth?sslmode=disable")


def test_pgsslmode_counts_when_the_url_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    load_settings(database_url="postgresql://u:pw@db.internal/payauth")
    monkeypatch.setenv("PGSSLMODE", "prefer")
    with pytest.raises(ConfigError):
        load_settings(database_url="postgresql://u:pw@db.internal/payauth")


@pytest.mark.parametrize("query", ["ssl_cert_reqs=none", "ssl_cert_reqs=optional",
                                   "ssl_check_hostname=false"])
def test_a_redis_url_may_not_turn_the_certificate_check_off(query: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(redis_url=f"rediss://u:pw@redis.internal:6380/0?{query}")
    assert "PAYAUTH_REDIS_URL" in str(info.value)


TLS_URL = ("rediss://payauth-worker:pw@ignored:1/2?ssl_ca_certs=/tls/ca.pem"
           "&ssl_certfile=/tls/client.pem&ssl_keyfile=/tls/client.key")


def test_the_sentinels_and_the_master_get_the_urls_tls_settings() -> None:
    tls = {"ssl": True, "ssl_ca_certs": "/tls/ca.pem", "ssl_certfile": "/tls/client.pem",
           "ssl_keyfile": "/tls/client.key"}
    assert master_options(TLS_URL) == {"username": "payauth-worker", "password": "pw", "db": 2,
                                       **tls}
    assert sentinel_options(TLS_URL, "spw", 0.5) == {
        "password": "spw", "socket_timeout": 0.5, "socket_connect_timeout": 0.5, **tls}


def test_a_plaintext_url_keeps_sentinels_and_master_plaintext() -> None:
    """The HA stack's Sentinels (deploy/local/ha.sh) speak plaintext, as its redis:// URL."""
    assert master_options("redis://:pw@ignored/0") == {"username": None, "password": "pw",
                                                        "db": 0, "ssl": False}
    assert sentinel_options("redis://:pw@ignored/0", "", 0.5) == {
        "password": None, "socket_timeout": 0.5, "socket_connect_timeout": 0.5}


def test_a_refusal_keeps_readiness_down_naming_it_until_accepted() -> None:
    health = Health()
    health.set_assigned([("t", 0)])
    health.postgres_ok = True
    assert health.ready() == (True, "ok")
    with structlog.testing.capture_logs() as logs:
        health.refused("kafka consumer", "Broker: Group authorization failed")
        for _ in range(5):
            health.report_refusals()  # the heartbeat, every 2 s: one line per interval
    ready, why = health.ready()
    assert not ready and why == "kafka consumer refused: Broker: Group authorization failed"
    assert [(e["event"], e["source"]) for e in logs] == [("engine_refused", "kafka consumer")]
    health.accepted("kafka consumer")
    assert health.ready() == (True, "ok")


def test_no_secret_reaches_a_log_line(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(
        database_url="postgresql://app:pg-S3cret%21@db.internal/payauth?sslmode=verify-full",
        redis_url="rediss://worker:redis-S3cret@redis.internal:6380/0",
        kafka_sasl_password="kafka-S3cret")
    configure_logging("json", "INFO", settings.secret_values())
    try:
        log = structlog.get_logger("t")
        log.warning("kafka_error", error="SASL authentication failed: kafka-S3cret rejected")
        log.warning("postgres_unavailable", error="connect to postgresql://app:pg-S3cret%21@db "
                    "failed (password pg-S3cret! wrong)")
        log.warning("redis_down", error="rediss://worker:redis-S3cret@redis.internal refused",
                    detail=["redis-S3cret"])
        log.warning("other", error="a URL no setting names: redis://:hunter22@elsewhere/0")
        log.info("partitions_assigned", partitions=[0, 1])  # no secret: left a list
        log.warning("nested", detail={"tries": [{"said": 'kafka-S3cret"quoted"'}]}, n=(1, 2))
    finally:
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
        with capsys.disabled():  # the real stderr again, not this test's capture
            configure_logging()
    assert len(lines) == 6 and lines[4]["partitions"] == [0, 1] and lines[5]["n"] == [1, 2]
    text = json.dumps(lines)
    for secret in ("kafka-S3cret", "pg-S3cret", "redis-S3cret", "hunter22"):
        assert secret not in text
    assert lines[0]["error"] == "SASL authentication failed: *** rejected"


def test_a_secret_that_json_escapes_is_masked_inside_a_list(
        capsys: pytest.CaptureFixture[str]) -> None:
    secret = 'pa"ss\\word'
    configure_logging("json", "INFO", [secret])
    try:
        structlog.get_logger("t").warning("refused", detail=[f"login {secret} refused"])
    finally:
        out = capsys.readouterr().err
        with capsys.disabled():
            configure_logging()
    [line] = [json.loads(text) for text in out.splitlines()]
    assert secret not in json.dumps(line) and secret not in str(line["detail"])
    assert "***" in line["detail"]
