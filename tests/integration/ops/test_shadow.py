"""``payauth replay --shadow`` against a planted decision bug: a ``sql/payauth_decide.sql`` that
declines refunds over 7.00 as CURRENCY_MISMATCH, deployed under a running worker and fixed by
the next deployment.
The shadow replay must list exactly the refunds the bug declined, write nothing anywhere,
and report nothing for decisions taken under the rule as it is now."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from service.ops.migrate import DEFINITIONS_DIR
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up

_RIGHT = "        WHEN auth_type IN ('REFUND', 'VERIFICATION') THEN 'APPROVED'\n"
_BUG = ("        WHEN auth_type = 'REFUND' AND amount > 7 THEN 'CURRENCY_MISMATCH'\n"
        + _RIGHT)


def _definitions_with_the_bug(directory: Path) -> Path:
    """The packaged definitions, with the bug planted in the rule's file."""
    shutil.copytree(DEFINITIONS_DIR, directory)
    rule = directory / "payauth_decide.sql"
    assert _RIGHT in rule.read_text()
    rule.write_text(rule.read_text().replace(_RIGHT, _BUG))
    return directory


def _seed(env: stack.Env, accounts: list[tuple[str, str, str]]) -> None:
    asyncio.run(stack.seed_accounts(env.dsn, accounts))


def _send(env: stack.Env, messages: list[dict[str, Any]]) -> list[str]:
    stack.produce(env.input_topic, [(m["body"]["account_id"].encode(), encode(m))
                                    for m in messages])
    return [m["body"]["transaction_id"] for m in messages]


def _message(account: str, kind: str, currency: str, amount: str = "5.00") -> dict[str, Any]:
    return auth_message(f"SH-{uuid.uuid4().hex[:10]}", account_id=account, amount=amount,
                        currency=currency, authorization_type=kind)


def _everything_written(env: stack.Env) -> dict[str, Any]:
    """What a shadow replay must leave exactly as it was."""
    counts = stack.fetch(env.dsn, """
        SELECT (SELECT count(*) FROM processed_transactions) AS decisions,
               (SELECT count(*) FROM ledger_entries) AS ledger,
               (SELECT sum(balance) FROM accounts) AS balances,
               (SELECT count(*) FROM duplicate_sightings) AS sightings,
               (SELECT count(*) FROM replay_marks) AS marks""")[0]
    return {**dict(counts),
            "output": stack.end_offsets(env.output_topic, env.partitions),
            "dlq": stack.end_offsets(env.dlq_topic, 1),
            "input": stack.end_offsets(env.input_topic, env.partitions),
            "committed": stack.committed_offsets(env.group_id, env.input_topic, env.partitions)}


def _shadow(env: stack.Env, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    report = tmp_path / f"shadow-{uuid.uuid4().hex[:6]}.json"
    done = payauth(env, "replay", "--shadow", *args, "--json", str(report))
    assert done.returncode in (0, 3), done.stderr
    return done.returncode, json.loads(report.read_text()), done.stdout


def test_shadow_replay_lists_exactly_what_a_planted_bug_decided(env, spawn_worker,
                                                                 tmp_path) -> None:
    eur, gbp = f"ACC-E-{uuid.uuid4().hex[:6]}", f"ACC-G-{uuid.uuid4().hex[:6]}"
    _seed(env, [(eur, "1000.00", "EUR"), (gbp, "1000.00", "GBP")])
    worker = spawn_worker(env)
    before_bug = _send(env, [_message(eur, "PURCHASE", "EUR"), _message(gbp, "REFUND", "GBP"),
                             _message(gbp, "PURCHASE", "GBP"), _message(eur, "REFUND", "EUR")])
    stack.produce(env.input_topic, [(b"bad", b'{"not": "an authorization"}')])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    # Before any change of the rule: nothing would change, and nothing is written.
    before = _everything_written(env)
    code, report, screen = _shadow(env, tmp_path, "--to-earliest")
    assert code == 0, screen
    assert _everything_written(env) == before, "a shadow replay wrote something"
    assert report["decided"] == 4 and report["unchanged"] == 4 and report["changed"] == []
    assert report["never_decided"]["dead_letter_again"] == {"SCHEMA_VIOLATION": 1}
    assert "nothing would change" in screen

    # The bug is deployed under the running worker, decides, and is fixed.
    assert payauth(env, "migrate", "--sql-dir",
                   str(_definitions_with_the_bug(tmp_path / "bug"))).returncode == 0
    gbp_refunds = _send(env, [_message(gbp, "REFUND", "GBP", "7.77") for _ in range(3)])
    unaffected = _send(env, [_message(eur, "REFUND", "EUR"), _message(gbp, "PURCHASE", "GBP"),
                             _message(eur, "PURCHASE", "EUR")])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    declined = stack.fetch(env.dsn, "SELECT txn_id FROM processed_transactions WHERE "
                                    "decline_reason = 'CURRENCY_MISMATCH'")
    assert sorted(r["txn_id"] for r in declined) == sorted(gbp_refunds), "the bug did not bite"
    assert payauth(env, "migrate").returncode == 0  # the packaged rule: the fix
    after_fix = _send(env, [_message(gbp, "REFUND", "GBP"), _message(eur, "PURCHASE", "EUR")])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    before = _everything_written(env)
    code, report, screen = _shadow(env, tmp_path, "--to-earliest")
    assert code == 3, screen
    [changed] = report["changed"]
    assert (changed["from"], changed["to"], changed["count"]) == (
        {"result": "DECLINED", "decline_reason": "CURRENCY_MISMATCH"},
        {"result": "APPROVED", "decline_reason": None}, 3), report
    assert sorted(changed["transaction_ids"]) == sorted(gbp_refunds)
    assert report["unchanged"] == len(before_bug) + len(unaffected) + len(after_fix)
    assert len(report["decided_under"]) == 2  # the bug's rule version and the right one
    assert "DECLINED (CURRENCY_MISMATCH) -> APPROVED" in screen
    assert _everything_written(env) == before, "a shadow replay wrote something"

    # Run again, nothing changed since: the same answer; and the transactions decided under
    # the rule as it is now differ in nothing.
    again_code, again, _ = _shadow(env, tmp_path, "--to-earliest")
    assert (again_code, again["changed"]) == (3, report["changed"])
    code, now_only, screen = _shadow(env, tmp_path, "--transactions",
                                     ",".join(before_bug + after_fix))
    assert code == 0 and now_only["unchanged"] == 6 and now_only["changed"] == [], screen

    # A message never decided (sent with the worker stopped, beyond the committed offset):
    # an explicit range shows what a replay would decide for it.
    assert worker.terminate() == 0
    pending = _send(env, [_message(eur, "PURCHASE", "EUR", amount="2000.00")])
    code, report, screen = _shadow(env, tmp_path, "--from-offset", "0")
    assert code == 3, screen
    assert report["never_decided"]["decide_now"] == [{
        "result": "DECLINED", "decline_reason": "INSUFFICIENT_FUNDS", "count": 1,
        "transaction_ids": pending}]


def test_shadow_replay_says_which_decisions_it_cannot_decide_again(env, spawn_worker,
                                                                   tmp_path) -> None:
    account = f"ACC-{uuid.uuid4().hex[:6]}"
    _seed(env, [(account, "100.00", "EUR")])
    ids = _send(env, [_message(account, "PURCHASE", "EUR") for _ in range(3)])
    spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    recorded = stack.fetch(env.dsn, "SELECT txn_id, input_balance, input_status, "
                                    "input_currency, rule_version FROM processed_transactions")
    assert all(r["rule_version"] and r["input_status"] == "ACTIVE"
               and r["input_currency"] == "EUR" for r in recorded), recorded
    # Each saw the balance the ones before it left (same partition: one account's key).
    assert sorted(r["input_balance"] for r in recorded) == [90, 95, 100]
    # A decision of a version that did not record its inputs.
    stack.fetch(env.dsn, "UPDATE processed_transactions SET input_balance = NULL, "
                         "input_status = NULL, input_currency = NULL, rule_version = NULL "
                         "WHERE txn_id = $1 RETURNING 1", ids[0])
    code, report, screen = _shadow(env, tmp_path, "--transactions", ",".join([*ids, "NOPE-1"]))
    assert code == 0, screen
    assert report["inputs_not_recorded"] == {"count": 1, "transaction_ids": [ids[0]]}
    assert report["unchanged"] == 2 and report["unknown_transaction_ids"] == ["NOPE-1"]
    assert payauth(env, "replay", "--shadow", "--execute", "--to-earliest").returncode == 2


def test_shadow_replay_agrees_with_the_worker_on_every_kind(env, spawn_worker, tmp_path) -> None:
    """Lifecycle messages, messages the worker dead-lettered LIFECYCLE_MISMATCH (an original
    that cannot be named, an advice or clearing in another currency than its account's),
    and decisions whose dedup records were purged (lifecycle ones kept in their records, a
    purchase in the ledger, a decline by its event): deciding the stream again with the code
    unchanged changes nothing."""
    eur, other = f"ACC-E-{uuid.uuid4().hex[:6]}", f"ACC-O-{uuid.uuid4().hex[:6]}"
    _seed(env, [(eur, "100.00", "EUR"), (other, "100.00", "EUR")])
    tag = uuid.uuid4().hex[:6]

    def lifecycle(txn: str, kind: str, amount: str, original: str | None = None,
                  account: str = eur, currency: str = "EUR") -> dict[str, Any]:
        extra = {} if original is None else {"original_transaction_id": original}
        return auth_message(f"{txn}-{tag}", account_id=account, amount=amount,
                            currency=currency, authorization_type=kind,
                            **({k: f"{v}-{tag}" for k, v in extra.items()}))

    stream = [
        lifecycle("HOLD", "AUTHORIZATION", "30.00"),
        lifecycle("REV", "REVERSAL", "10.00", "HOLD"),
        lifecycle("ORPHAN", "REVERSAL", "5.00", "LATER"),  # before its original
        lifecycle("LATER", "AUTHORIZATION", "20.00"),
        lifecycle("CLR", "CLEARING", "25.00", "HOLD"),
        lifecycle("BUY", "PURCHASE", "10.00"),
        lifecycle("TOO-MUCH", "PURCHASE", "900.00"),  # declined
        lifecycle("REFUND", "REFUND", "1.00"),
        # Dead-lettered LIFECYCLE_MISMATCH by the worker:
        lifecycle("CLR-OF-BUY", "CLEARING", "10.00", "BUY"),  # a purchase posted already
        lifecycle("REV-OF-REFUND", "REVERSAL", "1.00", "REFUND"),
        lifecycle("ADVICE-USD", "ADVICE", "5.00", currency="USD"),
        lifecycle("CLR-USD", "CLEARING", "5.00", currency="USD"),
    ]
    _send(env, stream)
    spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    # Another account's key is another partition: sent once its original is decided, or it
    # would wait for it as an orphan.
    _send(env, [lifecycle("REV-ELSEWHERE", "REVERSAL", "1.00", "HOLD", account=other)])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    dead = stack.read_topic(env.dlq_topic, expect=5)
    assert sorted(dict(r.headers())["error.reason"].decode() for r in dead) == \
        ["LIFECYCLE_MISMATCH"] * 5

    code, report, screen = _shadow(env, tmp_path, "--to-earliest")
    assert code == 0, screen
    assert report["never_decided"]["dead_letter_again"] == {"LIFECYCLE_MISMATCH": 5}
    assert report["never_decided"]["decide_now"] == []

    # The dedup records purged (their time set past the window, as an administrator may):
    # the lifecycle messages' effect is kept in their records, the purchase's in the ledger,
    # the decline leaves only its event.
    stack.fetch(env.dsn, "UPDATE processed_transactions "
                         "SET processed_at = now() - interval '1000 hours' RETURNING 1")
    assert payauth(env, "purge").returncode == 0
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM processed_transactions")[0]["n"] == 0
    code, report, screen = _shadow(env, tmp_path, "--to-earliest")
    assert code == 0, screen
    assert report["never_decided"]["decide_now"] == []
    assert report["event_only"]["transaction_ids"] == [f"TOO-MUCH-{tag}"]
    assert len(report["ledger_only"]["transaction_ids"]) == 8 - 1
    assert "nothing would change" in screen
