"""Kafka TLS/SASL settings reach librdkafka as it expects them; secrets never show."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer

from service.adapters.kafka.config import consumer_config, producer_config
from service.config import load_settings

pytestmark = pytest.mark.usefixtures("clean_payauth_env")


def test_scram_over_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAYAUTH_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("PAYAUTH_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("PAYAUTH_KAFKA_SASL_USERNAME", "payauth")
    monkeypatch.setenv("PAYAUTH_KAFKA_SASL_PASSWORD", "s3cr3t-scram")
    settings = load_settings()
    conf = producer_config(settings)
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert conf["sasl.password"] == "s3cr3t-scram"
    assert "s3cr3t-scram" not in repr(settings) and "s3cr3t-scram" not in str(settings)
    Producer(conf)  # librdkafka validates every key and value here (no connection yet)


def test_oauthbearer_oidc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAYAUTH_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("PAYAUTH_KAFKA_SASL_MECHANISM", "OAUTHBEARER")
    monkeypatch.setenv("PAYAUTH_KAFKA_SASL_OAUTHBEARER_METHOD", "oidc")
    monkeypatch.setenv("PAYAUTH_KAFKA_SASL_OAUTHBEARER_CLIENT_ID", "payauth")
    monkeypatch.setenv("PAYAUTH_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET", "oidc-secret")
    monkeypatch.setenv("PAYAUTH_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL",
                       "https://idp.example/oauth2/token")
    monkeypatch.setenv("PAYAUTH_KAFKA_SASL_OAUTHBEARER_SCOPE", "kafka")
    settings = load_settings()
    conf = consumer_config(settings)
    assert conf["sasl.oauthbearer.method"] == "oidc"
    assert conf["sasl.oauthbearer.client.secret"] == "oidc-secret"
    assert "oidc-secret" not in repr(settings)
    Consumer(conf).close()


def test_mutual_tls(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PAYAUTH_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("PAYAUTH_KAFKA_SSL_CA_LOCATION", "/etc/ssl/certs/ca.pem")
    monkeypatch.setenv("PAYAUTH_KAFKA_SSL_CERTIFICATE_LOCATION", "/etc/payauth/client.pem")
    monkeypatch.setenv("PAYAUTH_KAFKA_SSL_KEY_LOCATION", "/etc/payauth/client.key")
    monkeypatch.setenv("PAYAUTH_KAFKA_SSL_KEY_PASSWORD", "keypass")
    conf = producer_config(load_settings())
    assert conf["ssl.certificate.location"] == "/etc/payauth/client.pem"
    assert conf["ssl.key.password"] == "keypass"


def test_bad_protocol_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.config import ConfigError

    monkeypatch.setenv("PAYAUTH_KAFKA_SECURITY_PROTOCOL", "TLS")
    with pytest.raises(ConfigError, match="PAYAUTH_KAFKA_SECURITY_PROTOCOL"):
        load_settings()
