"""Settings match the contract and fail in one line; the result event matches the contract."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.config import ConfigError, Settings, load_settings
from service.domain.dedup import StoredResult
from service.domain.events import result_event
from service.domain.messages import event_id_for
from service.domain.vocabulary import DeclineReason, Result


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("PAYAUTH_"):
            monkeypatch.delenv(key)


def test_defaults_are_the_contract() -> None:
    s = load_settings()
    assert s.kafka_bootstrap_servers == "localhost:9092"
    assert s.group_id == "cg-payments"
    assert s.input_topic == "payments.authorizations"
    assert s.output_topic == "payments.authorized"
    assert s.dlq_topic == "payments.authorizations.dlq"
    assert s.database_url.get_secret_value() == "postgresql://localhost:5432/payauth"
    assert s.redis_url.get_secret_value() == "redis://localhost:6379/0"
    assert s.dedup_ttl_seconds == 86400 and s.dedup_retention_hours == 72
    assert s.metrics_port == 9100 and s.log_format == "json" and s.log_level == "INFO"


@pytest.mark.parametrize(
    ("var", "value"),
    [("PAYAUTH_METRICS_PORT", "abc"), ("PAYAUTH_METRICS_PORT", "70000"),
     ("PAYAUTH_LOG_FORMAT", "xml"), ("PAYAUTH_DATABASE_URL", "mysql://x"),
     ("PAYAUTH_REDIS_URL", "http://x"), ("PAYAUTH_DEDUP_TTL_SECONDS", "0")],
)
def test_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert var in message and "\n" not in message
    assert value not in message or var.endswith(("PORT", "FORMAT", "SECONDS"))


def test_secrets_are_not_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAYAUTH_DATABASE_URL", "postgresql://u:hunter2@db/payauth?sslmode=verify-full")
    assert "hunter2" not in repr(load_settings())


def test_cli_reports_bad_configuration_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    monkeypatch.setenv("PAYAUTH_METRICS_PORT", "nope")
    assert main(["verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("payauth: invalid configuration: PAYAUTH_METRICS_PORT")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("var", "value"),
    [("PAYAUTH_DATABASE_URL", "postgresql://payauth:s3cret@localhost:abc/payauth"),
     ("PAYAUTH_DATABASE_URL", "postgresql://payauth:s3cret@h1:5432,h2:99999/payauth"),
     ("PAYAUTH_REDIS_URL", "redis://:s3cret@localhost:abc/0"),
     ("PAYAUTH_MAX_REFUND_AMOUNT", "NaN")],
)
def test_malformed_url_port_is_one_line_without_the_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], var: str, value: str
) -> None:
    from service.cli import main

    monkeypatch.setenv(var, value)
    assert main(["verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"payauth: invalid configuration: {var}: "), err
    assert len(err.splitlines()) == 1 and "s3cret" not in err


def _stored(result: Result, reason: DeclineReason | None) -> StoredResult:
    return StoredResult(
        "TXN-VISA-8847291", "fp", result, reason, "ACC-44821", "125.50", "EUR", "PURCHASE",
        "txn-VISA-2026-8847291", datetime(2026, 4, 7, 14, 32, 15, 120000, tzinfo=UTC), False,
    )


def test_authorized_event_has_the_contract_shape() -> None:
    event = result_event(_stored(Result.APPROVED, None))
    assert event == {
        "event_type": "PaymentAuthorized",
        "event_id": event_id_for("TXN-VISA-8847291"),
        "transaction_id": "TXN-VISA-8847291",
        "account_id": "ACC-44821",
        "amount": "125.50",
        "currency": "EUR",
        "authorization_type": "PURCHASE",
        "result": "APPROVED",
        "decline_reason": None,
        "balance_delta": "-125.50",
        "held_delta": "0.00",
        "amount_approved": "125.50",
        "partial": False,
        "correlation_id": "txn-VISA-2026-8847291",
        "processed_at": "2026-04-07T14:32:15.120Z",
    }


def test_declined_event_and_stable_event_id() -> None:
    event = result_event(_stored(Result.DECLINED, DeclineReason.INSUFFICIENT_FUNDS))
    assert event["event_type"] == "PaymentDeclined"
    assert event["decline_reason"] == "INSUFFICIENT_FUNDS"
    assert (event["balance_delta"], event["held_delta"]) == ("0.00", "0.00")
    assert event_id_for("X") == event_id_for("X") != event_id_for("Y")


def test_event_bytes_are_compact_json_in_contract_order() -> None:
    # Republished events must stay byte-identical across versions: the bytes are those of
    # json.dumps with compact separators (what earlier versions wrote), keys in this order.
    import json

    from service.domain.events import encode_event

    for stored in (_stored(Result.APPROVED, None),
                   _stored(Result.DECLINED, DeclineReason.INSUFFICIENT_FUNDS)):
        event = result_event(stored)
        assert encode_event(event) == json.dumps(event, separators=(",", ":")).encode()


def test_every_setting_is_in_the_configuration_table() -> None:
    """docs/configuration.md's settings table is the operator's reference: no setting may
    hide."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    documented: set[str] = set()
    for row in readme.splitlines():
        names = re.findall(r"`(PAYAUTH_[A-Z0-9_]+|_[A-Z0-9_]+)`", row.split("|")[1]) \
            if row.startswith("| `PAYAUTH_") else []
        if not names:
            continue
        base = names[0].split("_")
        documented.add(names[0])
        # A row may group variables: `PAYAUTH_DB_POOL_MIN` / `_MAX`, `PAYAUTH_KAFKA_…`, `_SCOPE`.
        for sibling in names[1:]:
            if sibling.startswith("PAYAUTH_"):
                documented.add(sibling)
            else:
                documented.update("_".join(base[:i]) + sibling for i in range(2, len(base)))
    missing = {f"PAYAUTH_{name.upper()}" for name in Settings.model_fields} - documented
    assert not missing, sorted(missing)
