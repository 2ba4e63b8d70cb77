"""librdkafka settings for the consumer, the producer and the admin clients, from ``Settings``."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from service.config import Settings
from service.logs import librdkafka_logger

# The broker refuses who we are: a bad password, a failed TLS handshake (an untrusted or
# expired certificate). Waiting does not cure these; /readyz names them.
AUTHENTICATION_REFUSED = frozenset({
    KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL,
})
# The broker refuses what we ask: an ACL is missing.
AUTHORIZATION_REFUSED = frozenset({
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
})


def client_config(settings: Settings) -> dict[str, Any]:
    """Connection settings shared by consumer, producer and admin clients. librdkafka's own
    log lines go through the service's logging (JSON, rate-limited), never raw to stderr."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "security.protocol": settings.kafka_security_protocol,
        "client.id": f"payauth-{settings.instance_id()}",
        "logger": librdkafka_logger(settings.kafka_log_interval_seconds),
        # How fast a client follows a failover (docs/failover.md gives each reason and cost).
        # A broker that holds a connection open and answers nothing (paused, blackholed)
        # costs a request this long before the client gives up on it and asks the cluster
        # again (librdkafka's default, 60 s, stalled partitions a minute in the HA chaos run;
        # the brokers fence a silent node after 4 s, so 6 s is past the leaders' move).
        "socket.timeout.ms": 6_000,
        # A connection to a host that vanished (no refusal, no answer) given up after 3 s,
        # not 30 s: the next broker in the list is tried instead.
        "socket.connection.setup.timeout.ms": 3_000,
        # Back to a broker within half a second of its return, not after up to 10 s.
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 500,
        # A partition without a usable leader asks for metadata again from 100 ms, doubling
        # to 500 ms (librdkafka: up to 1 s), until the controller has named the new leader.
        "retry.backoff.ms": 100,
        "retry.backoff.max.ms": 500,
        # A leader change that no error announced (a broker that went quiet) is still seen
        # within 5 s (librdkafka: 5 minutes); cached metadata is trusted for 15 s at most.
        # The cost is one small Metadata request per client every 5 s.
        "topic.metadata.refresh.interval.ms": 5_000,
        "metadata.max.age.ms": 15_000,
    }
    if settings.kafka_sasl_mechanism:
        conf["sasl.mechanism"] = settings.kafka_sasl_mechanism
        if settings.kafka_sasl_username:
            conf["sasl.username"] = settings.kafka_sasl_username
            conf["sasl.password"] = settings.kafka_sasl_password.get_secret_value()
    if settings.kafka_ssl_ca_location:
        conf["ssl.ca.location"] = settings.kafka_ssl_ca_location
    if settings.kafka_ssl_certificate_location:
        conf["ssl.certificate.location"] = settings.kafka_ssl_certificate_location
        conf["ssl.key.location"] = settings.kafka_ssl_key_location
        if settings.kafka_ssl_key_password.get_secret_value():
            conf["ssl.key.password"] = settings.kafka_ssl_key_password.get_secret_value()
    if settings.kafka_sasl_oauthbearer_method:
        conf["sasl.oauthbearer.method"] = settings.kafka_sasl_oauthbearer_method
    if settings.kafka_sasl_oauthbearer_method == "oidc":
        conf.update({
            "sasl.oauthbearer.client.id": settings.kafka_sasl_oauthbearer_client_id,
            "sasl.oauthbearer.client.secret":
                settings.kafka_sasl_oauthbearer_client_secret.get_secret_value(),
            "sasl.oauthbearer.token.endpoint.url":
                settings.kafka_sasl_oauthbearer_token_endpoint_url,
        })
        if settings.kafka_sasl_oauthbearer_scope:
            conf["sasl.oauthbearer.scope"] = settings.kafka_sasl_oauthbearer_scope
    return conf


def consumer_config(settings: Settings) -> dict[str, Any]:
    conf = client_config(settings)
    conf.update(
        {
            "group.id": settings.group_id,
            "enable.auto.commit": True,
            "auto.commit.interval.ms": settings.commit_interval_ms,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": settings.session_timeout_ms,
            # A member's session counts from its last successful heartbeat: with librdkafka's
            # 3 s, a group coordinator that dies just after a beat leaves the members 3 s
            # less to find its successor before they time out and the whole group
            # rebalances. Members also learn of a rebalance at their next beat, so joins and
            # departures settle within a second. The cost: one small request a second.
            "heartbeat.interval.ms": 1_000,
            "max.poll.interval.ms": settings.max_poll_interval_ms,
            # Bound what librdkafka prefetches (default 64 MiB): memory stays flat under lag.
            "queued.max.messages.kbytes": 16_384,
            "statistics.interval.ms": 5_000,
            "enable.partition.eof": False,
        }
    )
    if settings.kafka_fetch_wait_ms:
        # The broker answers a fetch when it has a megabyte or after this wait: under a
        # steady load a fetch then brings a few milliseconds of messages, not each producer
        # batch on its own (every fetch costs the broker and the worker a request and a
        # hand-off); a backlog has the megabyte at once and waits for nothing
        # (docs/benchmark.md, "Design figures").
        conf["fetch.wait.max.ms"] = settings.kafka_fetch_wait_ms
        conf["fetch.min.bytes"] = 1_000_000
    if settings.group_instance_id:
        conf["group.instance.id"] = settings.group_instance_id
    return conf


def producer_config(settings: Settings) -> dict[str, Any]:
    conf = client_config(settings)
    conf.update(
        {
            # librdkafka's default is false: without it a retried send can duplicate or
            # reorder events.
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "delivery.timeout.ms": settings.delivery_timeout_ms,
            # Stated, not left to the library's default: the dead-letter size cap reads it.
            "message.max.bytes": settings.kafka_message_max_bytes,
            "compression.type": "lz4",
        }
    )
    return conf
