"""The consumer's fetch wait (PAYAUTH_KAFKA_FETCH_WAIT_MS): librdkafka takes the keys, 0 turns
the wait off, and an out-of-range value is a one-line configuration error."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer

from service.adapters.kafka.config import consumer_config
from service.config import ConfigError, load_settings

pytestmark = pytest.mark.usefixtures("clean_payauth_env")


def test_a_steady_load_waits_a_few_ms_a_backlog_none() -> None:
    conf = consumer_config(load_settings())
    assert conf["fetch.wait.max.ms"] == 5
    assert conf["fetch.min.bytes"] == 1_000_000  # a backlog fills it at once
    Consumer(conf).close()  # librdkafka validates every key and value here (no connection)


def test_zero_answers_each_fetch_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAYAUTH_KAFKA_FETCH_WAIT_MS", "0")
    conf = consumer_config(load_settings())
    assert "fetch.wait.max.ms" not in conf and "fetch.min.bytes" not in conf


def test_a_wait_past_the_poll_cadence_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAYAUTH_KAFKA_FETCH_WAIT_MS", "5000")
    with pytest.raises(ConfigError, match="PAYAUTH_KAFKA_FETCH_WAIT_MS"):
        load_settings()
