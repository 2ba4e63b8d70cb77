"""The database speaks the same words as the code: the migrations' CHECKs and the literals of
the functions in ``sql/``, read from the SQL files, against ``service/domain/vocabulary.py``."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path

from service.domain import vocabulary as v

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
DEFINITIONS = Path(__file__).resolve().parents[2] / "sql"


def sql(name: str, directory: Path = MIGRATIONS) -> str:
    text = (directory / name).read_text()
    return re.sub(r"--[^\n]*", "", text)  # comments may quote anything


def in_lists(text: str, column: str) -> list[set[str]]:
    """Every ``column IN ('A', 'B')`` of the text, as sets."""
    return [set(re.findall(r"'([^']*)'", m))
            for m in re.findall(rf"\b{column}\s+IN\s*\(([^)]*)\)", text)]


def values(enum: type[StrEnum]) -> set[str]:
    return {member.value for member in enum}


def latest(column: str) -> set[str]:
    """The last ``CHECK (column IN (...))`` the migrations write, in their order: what the
    schema checks now."""
    found = [set(re.findall(r"'([^']*)'", listed))
             for path in sorted(MIGRATIONS.glob("*.sql"))
             for listed in re.findall(rf"CHECK\s*\(\s*{column}\s+IN\s*\(([^)]*)\)",
                                      sql(path.name))]
    assert found, column
    return found[-1]


def test_the_latest_checks_name_the_vocabulary() -> None:
    assert latest("decline_reason") == values(v.DeclineReason)
    assert latest("authorization_type") == values(v.AuthorizationType)


def test_schema_checks_name_the_vocabulary() -> None:
    schema = sql("001_schema.sql")
    assert in_lists(schema, "status") == [values(v.AccountStatus)]
    assert in_lists(schema, "result") == [values(v.Result)]
    # 001's reasons and kinds, widened since (above)
    assert in_lists(schema, "decline_reason") == [{"INSUFFICIENT_FUNDS", "UNKNOWN_ACCOUNT",
                                                   "CURRENCY_MISMATCH", "ACCOUNT_BLOCKED"}]
    assert in_lists(schema, "type") == [{"PURCHASE", "REFUND"}]
    assert in_lists(schema, "authorization_type") == [{"PURCHASE", "REFUND"}]
    assert set(re.findall(r"(?:account_id|txn_id) ~ '([^']*)'", schema)) == \
        {v.IDENTIFIER_PATTERN}
    assert set(re.findall(r"currency ~ '([^']*)'", schema)) == {v.CURRENCY_PATTERN}
    assert set(re.findall(r"amount\)? <= (\d{5,})", schema)) == {str(v.MAX_AMOUNT)}
    assert re.findall(r"scale\(amount\) <= (\d+)", schema) == [str(v.MAX_AMOUNT_DECIMALS)]


def test_the_lifecycle_schema_speaks_the_vocabulary() -> None:
    lifecycle = sql("010_authorization_lifecycle.sql")
    assert in_lists(lifecycle, "authorization_type")[0] <= values(v.AuthorizationType)
    ledger_type_check, *sign_checks = in_lists(lifecycle, "type")
    assert ledger_type_check == set(v.LEDGER_TYPES)
    assert set().union(*sign_checks) == set(v.LEDGER_TYPES)
    holds_kind, messages_kind, *_superseded = in_lists(lifecycle, "kind")
    assert holds_kind == {"AUTHORIZATION", "ADVICE"}
    assert messages_kind <= set(v.LIFECYCLE_KINDS)
    # lifecycle_messages' now (014's; card_blocks' kinds came after, below)
    assert in_lists(sql("014_an_issuers_whole_day.sql"), "kind") == [set(v.LIFECYCLE_KINDS)]
    states = in_lists(lifecycle, "state")
    assert states[0] == values(v.HoldState)
    assert states[1] == values(v.OrphanState)
    assert latest("state") == values(v.OrphanState)  # early_clearings' (014)
    assert in_lists(lifecycle, "result")[0] == values(v.Result)
    assert set(re.findall(r"state = '([A-Z]+)'", lifecycle)) <= \
        values(v.HoldState) | values(v.OrphanState)


WORDS = (values(v.Result) | values(v.DeclineReason) | values(v.AccountStatus)
         | values(v.AuthorizationType) | values(v.HoldState) | values(v.OrphanState)
         | values(v.CardStatus) | values(v.LimitScope) | values(v.LimitPeriod)
         | values(v.BlockKind) | {v.PARTIAL})


def test_the_decision_function_speaks_only_the_vocabulary() -> None:
    function = sql("payauth_decide.sql", DEFINITIONS)
    card = sql("payauth_card_verdict.sql", DEFINITIONS)
    literals = set(re.findall(r"'([A-Z][A-Z0-9_]*)'", function + card))
    assert literals - {"PA409"} <= WORDS, literals - WORDS  # PA409: the lost claim's SQLSTATE
    # Every decline reason can be given (the card's by its verdict), and an approval.
    assert values(v.DeclineReason) | {v.Result.APPROVED.value} <= literals
    # The status that allows a decision is the vocabulary's, by name.
    assert f"<> '{v.AccountStatus.ACTIVE}'" in function


def test_a_drifted_literal_is_caught() -> None:
    drifted = "CHECK (status IN ('ACTIVE', 'BLOCKED', 'SUSPENDED'))"
    assert in_lists(drifted, "status") != [values(v.AccountStatus)]


def test_duplicate_sightings_speak_the_vocabulary() -> None:
    sightings = sql("006_duplicate_provenance.sql")
    assert in_lists(sightings, "cause") == [values(v.DuplicateCause)]
    assert in_lists(sightings, "layer") == [values(v.DuplicateLayer)]


def test_the_definitions_speak_only_the_vocabulary() -> None:
    """Every upper-case literal of every function and view in ``sql/`` is a word of the
    vocabulary (or the lost claim's SQLSTATE, the lifecycle route's handing a batch back,
    PAOFF, PostgreSQL's name of what fired a trigger, TG_OP, or the time zone the dedup
    store's periods are days of, UTC)."""
    postgres_own = {"PA409", "PAOFF", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "UTC"}
    for path in sorted(DEFINITIONS.glob("*.sql")):
        literals = set(re.findall(r"'([A-Z][A-Z0-9_]*)'", sql(path.name, DEFINITIONS)))
        assert literals - postgres_own <= WORDS, (path.name, literals - WORDS)


def test_the_card_controls_schema_speaks_the_vocabulary() -> None:
    controls = sql("016_card_controls.sql")
    assert in_lists(controls, "status") == [values(v.CardStatus)]
    assert in_lists(controls, "scope") == [values(v.LimitScope)] * 2
    assert in_lists(controls, "period") == [values(v.LimitPeriod)]
    assert in_lists(controls, "kind") == [values(v.BlockKind)]
    assert latest("decline_reason") == values(v.DeclineReason)
