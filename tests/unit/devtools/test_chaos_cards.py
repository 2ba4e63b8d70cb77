"""The chaos checker's card findings (service/devtools/chaos/cards.py) on logs made by hand,
with their negative controls: a usage counted twice, a decision that disagrees with the
status it read, one decided after the last change that read the status before it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from service.devtools.chaos.cards import card_of, limit_findings, limit_ids, toggle_findings

CARD = card_of("CHR-r-001")
DAY, MONTH = limit_ids(CARD)


def _purchase(txn: str, amount: str, expect: str = "approved") -> dict[str, Any]:
    return {"txn": txn, "expect": expect, "type": "PURCHASE", "amount": amount, "card": CARD}


LOG = [_purchase("T1", "10.00"), _purchase("T1", "10.00"),  # a duplicate
       _purchase("T2", "2.50"), _purchase("T3", "7.00", "declined"),
       {"txn": "T4", "expect": "approved", "type": "PURCHASE", "amount": "99.00"}]  # no card


def test_each_limit_holds_the_distinct_approved_purchases_of_its_card() -> None:
    usage = {DAY: (Decimal("12.50"), 2), MONTH: (Decimal("12.50"), 2)}
    assert limit_findings(LOG, usage).ok


def test_a_usage_counted_twice_is_caught() -> None:
    usage = {DAY: (Decimal("22.50"), 3), MONTH: (Decimal("12.50"), 2)}  # T1 twice, daily
    finding = limit_findings(LOG, usage)
    assert not finding.ok and finding.violations == [
        f"{DAY}: usage 22.50 in 3, the log implies 12.50 in 2"]


def test_a_usage_never_counted_is_caught() -> None:
    assert not limit_findings(LOG, {}).ok


def _verification(txn: str, started: int, completed: int, status: str) -> dict[str, Any]:
    return {"txn": txn, "expect": "approved", "type": "VERIFICATION", "amount": "0.00",
            "card": "CHT-r-CARD", "toggle": [started, completed, status, False]}


def _judged(status: str) -> dict[str, Any]:
    return {"result": "APPROVED" if status == "ACTIVE" else "DECLINED",
            "decline_reason": None if status == "ACTIVE" else "CARD_BLOCKED",
            "input_card_status": status}


def test_each_decision_is_judged_by_the_status_it_read() -> None:
    log = [_verification("V1", 0, 0, "ACTIVE"), _verification("V2", 1, 0, "ACTIVE"),
           _verification("V3", 1, 1, "FROZEN")]
    # V2 was sent while the freeze was under way: either status will do.
    judged = {"V1": _judged("ACTIVE"), "V2": _judged("FROZEN"), "V3": _judged("FROZEN")}
    assert toggle_findings(log, judged, changes=1).ok
    wrong = {**judged, "V1": {**_judged("FROZEN"), "result": "APPROVED"}}
    assert not toggle_findings(log, wrong, changes=1).ok


def test_a_decision_after_the_last_change_that_read_the_status_before_it_is_caught() -> None:
    log = [_verification("V3", 1, 1, "FROZEN")]
    finding = toggle_findings(log, {"V3": _judged("ACTIVE")}, changes=1)
    assert finding.violations == ["V3: sent after the last change (FROZEN) returned, read "
                                  "ACTIVE"]
    # Another change started after it was sent: the status it read may be either.
    assert toggle_findings(log, {"V3": _judged("ACTIVE")}, changes=2).ok
