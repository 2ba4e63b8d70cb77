"""Settings from the environment (prefix ``PAYAUTH_``), validated once at start-up.

A bad value stops start-up with one line naming the variable (see ``load_settings``).
"""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    dedup_ttl_seconds: int = Field(default=86_400, ge=1)
    dedup_retention_hours: int = Field(default=72, ge=1)
    # In-worker retention: every replica tries, an advisory lock lets one purge at a time.
    # 0 disables it (run `payauth purge` from a CronJob instead).
    purge_interval_seconds: int = Field(default=3_600, ge=0)

    # --- Processing
    max_batch_size: int = Field(default=1_000, ge=1, le=10_000)
    max_in_flight_per_partition: int = Field(default=5_000, ge=1)
    # Batches in flight at once (each on its own partitions): overlaps one batch's waits on
    # PostgreSQL and Kafka with the next one's work.
    max_concurrent_batches: int = Field(default=3, ge=1, le=16)
    max_message_bytes: int = Field(default=65_536, ge=1_024)
    commit_interval_ms: int = Field(default=1_000, ge=100)
    delivery_timeout_ms: int = Field(default=30_000, ge=1_000)
    retry_backoff_initial_ms: int = Field(default=100, ge=1)
    retry_backoff_max_ms: int = Field(default=10_000, ge=1)
    shutdown_timeout_seconds: float = Field(default=30.0, gt=0)

    # --- Observability
    metrics_port: int = Field(default=9100, ge=0, le=65_535)
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # --- Test-only fault injection (never set in production): name of a commit point at
    # which the worker kills itself with SIGKILL ("before_db_commit", "after_db_commit",
    # "after_publish", "after_redis_set"), or "rollback_once": roll the first batch's
    # transaction back after its writes, as a failing COMMIT would.
    fault_point: Literal["", "before_db_commit", "after_db_commit", "after_publish",
                         "after_redis_set", "rollback_once"] = ""
    # Test-only, deliberately WRONG commit order, for the checker's negative control: write
    # the Redis key before the database COMMIT. Never set this anywhere else.
    unsafe_ordering: Literal["", "redis_before_commit"] = ""

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _postgres_scheme(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("must start with postgresql://")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis:// or rediss://")
        return value

    def instance_id(self) -> str:
        return self.group_instance_id or socket.gethostname()


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
