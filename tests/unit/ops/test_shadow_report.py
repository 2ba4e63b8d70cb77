"""The shadow replay's report: each transaction counted once, in one group; exit status 3
exactly when a stored decision or a never-decided message would change."""

from __future__ import annotations

from service.ops.shadow_report import EXAMPLES_ON_SCREEN, Decision, ShadowReport

APPROVED = Decision("APPROVED")
NO_FUNDS = Decision("DECLINED", "INSUFFICIENT_FUNDS")
MISMATCH = Decision("DECLINED", "CURRENCY_MISMATCH")


def test_decisions_read_from_the_rules_answer() -> None:
    assert Decision.of("APPROVED") == APPROVED
    assert Decision.of("CURRENCY_MISMATCH") == MISMATCH
    assert str(MISMATCH) == "DECLINED (CURRENCY_MISMATCH)" and str(APPROVED) == "APPROVED"


def test_unchanged_decisions_change_nothing() -> None:
    report = ShadowReport("t", "abc")
    for i in range(3):
        assert report.first_time(f"T{i}")
        report.add_decided(f"T{i}", APPROVED, APPROVED, "abc")
    assert not report.first_time("T0")  # a second message of T0 is compared once
    report.dead_lettered_again["SCHEMA_VIOLATION"] += 2  # refused again: no change either
    assert (report.decided, report.unchanged, report.would_change) == (3, 3, False)
    assert report.render().endswith("nothing would change")
    assert report.as_json()["would_change"] is False


def test_changed_decisions_are_grouped_by_old_and_new() -> None:
    report = ShadowReport("t", "new")
    report.add_decided("A", MISMATCH, APPROVED, "old")
    report.add_decided("B", MISMATCH, APPROVED, "old")
    report.add_decided("C", APPROVED, NO_FUNDS, "old")
    report.add_decided("D", APPROVED, APPROVED, "new")
    assert report.would_change and report.changed_count == 3 and report.unchanged == 1
    assert report.rule_versions == {"old": 3, "new": 1}
    document = report.as_json()
    assert document["changed"] == [
        {"from": APPROVED.as_json(), "to": NO_FUNDS.as_json(), "count": 1,
         "transaction_ids": ["C"]},
        {"from": MISMATCH.as_json(), "to": APPROVED.as_json(), "count": 2,
         "transaction_ids": ["A", "B"]},
    ]
    screen = report.render()
    assert "DECLINED (CURRENCY_MISMATCH) -> APPROVED" in screen and "e.g. A, B" in screen
    assert "3 stored decision(s) differ" in screen


def test_decisions_without_inputs_are_not_guessed() -> None:
    report = ShadowReport("t", "new")
    report.add_decided("OLD", APPROVED, None, None)
    assert report.not_recorded == ["OLD"] and report.decided == 1
    assert not report.would_change


def test_a_message_never_decided_that_a_replay_would_decide_is_a_change() -> None:
    report = ShadowReport("t", "new")
    report.would_decide.setdefault(APPROVED, []).append("NEW-1")
    assert report.would_change
    assert "A replay would decide 1 message(s)" in report.render()


def test_the_screen_shows_a_few_ids_and_the_json_all_of_them() -> None:
    report = ShadowReport("t", "new")
    ids = [f"T{i}" for i in range(EXAMPLES_ON_SCREEN + 3)]
    for txn in ids:
        report.add_decided(txn, MISMATCH, APPROVED, "old")
    assert f"T{EXAMPLES_ON_SCREEN}" not in report.render() and ", …" in report.render()
    assert report.as_json()["changed"][0]["transaction_ids"] == ids


def test_a_rule_that_gives_no_answer_is_a_change_not_a_pass() -> None:
    report = ShadowReport("t", "broken")
    report.no_answer.append("T1")
    report.add_decided("T2", APPROVED, APPROVED, "broken")
    assert report.would_change and report.decided == 2
    assert "no answer from the rule now" in report.render()
    assert report.as_json()["no_answer"] == {"count": 1, "transaction_ids": ["T1"]}
