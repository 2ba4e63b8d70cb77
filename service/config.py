"""Settings from the environment (prefix ``PAYAUTH_``), validated once at start-up.

A bad value stops start-up with one line naming the variable (see ``load_settings``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from decimal import Decimal
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.domain.vocabulary import DEFAULT_MAX_REFUND


class ConfigError(Exception):
    """A setting is missing or malformed; the message is one line meant for the operator."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PAYAUTH_", extra="ignore")

    # --- Kafka
    kafka_bootstrap_servers: str = "localhost:9092"
    group_id: str = "cg-payments"
    input_topic: str = "payments.authorizations"
    output_topic: str = "payments.authorized"
    dlq_topic: str = "payments.authorizations.dlq"
    # Static membership: a stable per-replica id (pod name) means a rolling restart does not
    # rebalance the group. Empty disables it (every start is a new member).
    group_instance_id: str = ""
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = (
        "PLAINTEXT"
    )
    kafka_sasl_mechanism: str = ""
    kafka_sasl_username: str = ""
    kafka_sasl_password: SecretStr = SecretStr("")
    kafka_ssl_ca_location: str = ""
    kafka_ssl_certificate_location: str = ""  # client certificate (mutual TLS)
    kafka_ssl_key_location: str = ""
    kafka_ssl_key_password: SecretStr = SecretStr("")
    # SASL/OAUTHBEARER with an OIDC token endpoint (method "oidc"); "default" is unsecured
    # JWTs for development only.
    kafka_sasl_oauthbearer_method: Literal["", "default", "oidc"] = ""
    kafka_sasl_oauthbearer_client_id: str = ""
    kafka_sasl_oauthbearer_client_secret: SecretStr = SecretStr("")
    kafka_sasl_oauthbearer_token_endpoint_url: str = ""
    kafka_sasl_oauthbearer_scope: str = ""
    # librdkafka repeats a connection error many times a second: the worker logs each kind
    # once per this many seconds, with how often it was repeated meanwhile.
    kafka_log_interval_seconds: float = Field(default=30.0, gt=0)
    session_timeout_ms: int = Field(default=45_000, ge=6_000, le=300_000)
    max_poll_interval_ms: int = Field(default=300_000, ge=10_000)

    # --- Stores
    database_url: SecretStr = SecretStr("postgresql://localhost:5432/payauth")
    db_pool_min: int = Field(default=2, ge=1)
    db_pool_max: int = Field(default=8, ge=1)
    statement_timeout_ms: int = Field(default=10_000, ge=100)
    lock_timeout_ms: int = Field(default=5_000, ge=100)
    redis_url: SecretStr = SecretStr("redis://localhost:6379/0")
    redis_timeout_seconds: float = Field(default=0.5, gt=0)
    # Redis behind Sentinel: the Sentinels (host:port, comma-separated) name the master of
    # redis_sentinel_master; the worker follows a failover without a restart. The master's
    # password and database number come from redis_url (its host is then not used).
    redis_sentinels: str = ""
    redis_sentinel_master: str = Field(default="", validate_default=True)
    redis_sentinel_password: SecretStr = SecretStr("")  # the Sentinels' own, if they ask
    dedup_ttl_seconds: int = Field(default=86_400, ge=1)
    dedup_retention_hours: float = Field(default=72, gt=0)
    # In-worker retention: every replica tries, an advisory lock lets one purge at a time.
    # 0 disables it (run `payauth purge` from a CronJob instead).
    purge_interval_seconds: int = Field(default=3_600, ge=0)
    # `payauth holds expire` ends holds at least this old (placed_at, the database's clock).
    hold_expiry_hours: float = Field(default=168, gt=0, allow_inf_nan=False)
    # The zone whose calendar a spending limit's DAY, WEEK and MONTH follow (an IANA name),
    # read from each message's own time.
    limits_timezone: str = "UTC"

    # --- Processing
    max_batch_size: int = Field(default=1_000, ge=1, le=10_000)
    max_in_flight_per_partition: int = Field(default=5_000, ge=1)
    # Batches in flight at once (each on its own partitions): overlaps one batch's waits on
    # PostgreSQL and Kafka with the next one's work.
    max_concurrent_batches: int = Field(default=3, ge=1, le=16)
    max_message_bytes: int = Field(default=65_536, ge=1_024)
    # The largest REFUND decided without a person: a larger one is dead-lettered
    # (LIMIT_EXCEEDED) for a check and a redrive. A credit needs no funds, so without a
    # bound one message could credit any sum.
    max_refund_amount: Decimal = Field(default=DEFAULT_MAX_REFUND, gt=0, allow_inf_nan=False)
    # The producer's message.max.bytes: the largest record the worker sends. A dead letter
    # larger than this (or than the dead-letter topic's max.message.bytes, read at start)
    # carries a preview and the original's size and hash instead of the whole original.
    kafka_message_max_bytes: int = Field(default=1_000_000, ge=65_536, le=100_000_000)
    # A partition whose oldest unfinished message is older than this makes /readyz fail,
    # naming it (payauth_oldest_unfinished_seconds shows the age).
    stalled_partition_seconds: float = Field(default=120.0, gt=0)
    commit_interval_ms: int = Field(default=1_000, ge=100)
    delivery_timeout_ms: int = Field(default=30_000, ge=1_000)
    # How long the broker may hold a fetch to gather messages (fetch.wait.max.ms; 0: answer
    # as soon as one message is there). A few ms halve the fetches under a steady load.
    kafka_fetch_wait_ms: int = Field(default=5, ge=0, le=500)
    retry_backoff_initial_ms: int = Field(default=100, ge=1)
    retry_backoff_max_ms: int = Field(default=10_000, ge=1)
    shutdown_timeout_seconds: float = Field(default=30.0, gt=0)

    # --- Observability
    metrics_port: int = Field(default=9100, ge=0, le=65_535)
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("limits_timezone")
    @classmethod
    def _iana_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not an IANA time zone (such as Europe/Madrid)") \
                from None
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        if not url.startswith(("postgresql://", "postgres://")):
            raise ValueError("must start with postgresql://")
        # libpq's form: [user[:password]@]host[:port][,host[:port]…][/database][?…]
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2]
        for host in hosts.split(","):
            _check_port(host.rpartition("]")[2] if host.startswith("[") else host)
        _check_postgres_tls(parts.netloc.rpartition("@")[2], parse_qs(parts.query))
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis:// or rediss://")
        if not url.startswith("unix://"):
            parts = urlsplit(url)
            hosts = parts.netloc.rpartition("@")[2]
            _check_port(hosts.rpartition("]")[2] if hosts.startswith("[") else hosts)
            database = parts.path.lstrip("/")
            if database and not (database.isascii() and database.isdigit()):
                raise ValueError("has a database that is not a number (redis://host:port/0)")
            query = {k: v[-1].lower() for k, v in parse_qs(parts.query).items()}
            if query.get("ssl_cert_reqs", "required") != "required" or \
                    query.get("ssl_check_hostname", "true") in ("false", "0", "no"):
                raise ValueError("turns off the check of the server's certificate "
                                 "(ssl_cert_reqs, ssl_check_hostname): remove it and give "
                                 "the CA with ssl_ca_certs")
        return value

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels(cls, value: str, info: ValidationInfo) -> str:
        for host_port in _host_ports(value):
            host, colon, port = host_port.rpartition(":")
            if not colon or not host or not port:
                raise ValueError("must be host:port[,host:port…]")
            _check_port(host_port)
        url = info.data.get("redis_url")
        if value.strip() and url is not None and url.get_secret_value().startswith("unix://"):
            raise ValueError("cannot be used with a unix:// PAYAUTH_REDIS_URL")
        return value

    @field_validator("redis_sentinel_master")
    @classmethod
    def _sentinel_master_named(cls, value: str, info: ValidationInfo) -> str:
        if str(info.data.get("redis_sentinels", "")).strip() and not value:
            raise ValueError("must name the master the Sentinels watch when "
                             "PAYAUTH_REDIS_SENTINELS is set")
        return value

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [(host.strip("[]"), int(port))
                for host, _, port in (h.rpartition(":") for h in _host_ports(self.redis_sentinels))]

    def instance_id(self) -> str:
        return self.group_instance_id or socket.gethostname()

    def secret_values(self) -> list[str]:
        """Every secret the settings hold, for the logs' masking: each secret setting and
        the passwords inside the URLs (which a library may quote without the URL)."""
        values = [getattr(self, name).get_secret_value() for name, field in
                  type(self).model_fields.items() if field.annotation in (SecretStr, "SecretStr")]
        for url in (self.database_url, self.redis_url):
            password = urlsplit(url.get_secret_value()).password
            if password:
                values += [password, unquote(password)]
        return [v for v in values if v]


def _host_ports(text: str) -> list[str]:
    """The non-empty items of a comma-separated ``host:port`` list."""
    return [item.strip() for item in text.split(",") if item.strip()]


# asyncpg's modes that fall back to plaintext on their own: "prefer" (its default, when
# neither the URL nor PGSSLMODE says) retries without TLS when TLS fails and checks no
# certificate; "allow" tries without TLS first. ("disable" is plaintext by choice.)
_FALLBACK_SSLMODES = {"allow", "prefer"}


def _sslmode(query: dict[str, list[str]]) -> str:
    return (query.get("sslmode") or [os.environ.get("PGSSLMODE") or "prefer"])[-1]


def _check_postgres_tls(hosts: str, query: dict[str, list[str]]) -> None:
    """No connection to another machine that could fall back to plaintext: a host that is
    not loopback needs sslmode=verify-full, verify-ca or require (asyncpg never retries
    those without TLS), or an explicit sslmode=disable (logged at start). Loopback and Unix
    sockets stay as configured (the local stacks)."""
    mode = _sslmode(query)
    if mode in _FALLBACK_SSLMODES and _remote(hosts, query):
        raise ValueError(f"sslmode={mode} may fall back to plaintext to a host that is not "
                         "loopback: use sslmode=verify-full (with sslrootcert=CA file)")


def database_plaintext(url: str) -> bool:
    """The URL connects to another machine without TLS by choice (sslmode=disable)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    return _sslmode(query) == "disable" and _remote(parts.netloc.rpartition("@")[2], query)


def _remote(hosts: str, query: dict[str, list[str]]) -> bool:
    """Some host of the URL (or its ``host`` parameter, or PGHOST) is not loopback."""
    names = [_host_of(item) for item in hosts.split(",")]
    names += [h for value in query.get("host", []) for h in value.split(",")]
    if not any(names):
        names = [os.environ.get("PGHOST", "localhost")]
    return any(not _loopback(name) for name in names if name)


def _host_of(host_port: str) -> str:
    """``host`` of ``host[:port]`` or ``[v6][:port]``."""
    if host_port.startswith("["):
        return host_port[1:].partition("]")[0]
    return host_port.rpartition(":")[0] if ":" in host_port else host_port


def _loopback(host: str) -> bool:
    if host == "localhost" or host.startswith("/"):  # a Unix socket's directory
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_port(host_port: str) -> None:
    """``host:port`` (or ``host``, or ``:port`` after an IPv6 address): a port, if any, is a
    number from 1 to 65535. The message quotes nothing of the URL (it may hold a password)."""
    _, colon, port = host_port.rpartition(":")
    if colon and port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65_536):
        raise ValueError("has a port that is not a number from 1 to 65535")


def load_settings(**overrides: object) -> Settings:
    """Build the settings; raise ``ConfigError`` with one line naming the first bad variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        raise ConfigError(
            f"invalid configuration: PAYAUTH_{field.upper()}: {err['msg']}"
        ) from None
