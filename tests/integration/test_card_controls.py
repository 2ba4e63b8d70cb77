"""Card controls and spending limits through a real worker (CONTRACT.md, "Card controls and
spending limits"): each message sent to the broker and decided by ``payauth run``; the cards,
limits and statuses set by the operator's commands; the usage checked in the database and
the declines on the output topic."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from service.ops import csv_file, limits
from tests.support import lifecycle as lc
from tests.support import stack
from tests.support.factory import encode
from tests.support.workers import payauth, wait_caught_up


def _blocks(env: stack.Env, *blocks: tuple[str, str, str, str]) -> None:
    """Card blocks, each (scope, scope_id, kind, value), inserted by hand, as the contract
    lets an operator do (``payauth blocks load`` is tested below)."""
    scopes, ids, kinds, values = (list(column) for column in zip(*blocks, strict=True))
    assert stack.fetch(env.dsn, "INSERT INTO card_blocks (scope, scope_id, kind, value) "
                                "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], "
                                "$4::text[]) RETURNING 1", scopes, ids, kinds, values)


def _at(message: dict[str, Any], timestamp: str, message_id: str | None = None
        ) -> dict[str, Any]:
    """The message stamped at ``timestamp`` (its own time), optionally with another
    message_id (a producer's retry)."""
    headers = {**message["headers"], "timestamp": timestamp}
    if message_id is not None:
        headers["message_id"] = message_id
    return {**message, "headers": headers}


def _on_card(t: dict[str, str], key: str, kind: str, amount: str,
             original: str | None = None, at: str = "2026-04-07T10:00:00Z") -> dict[str, Any]:
    """The test's message ``t[key]`` of its account on its card, stamped ``at``."""
    return _at(lc.msg(t[key], kind, t["acc"], amount, original, card_id=t["card"]), at)


def _usage(env: stack.Env, limit_id: str) -> dict[str, tuple[Any, int]]:
    return {str(r["period_start"]): (r["amount"], r["count"]) for r in stack.fetch(
        env.dsn, "SELECT period_start, amount, count FROM limit_usage WHERE limit_id = $1",
        limit_id)}


def _outcomes(events: dict[str, dict[str, Any]], t: dict[str, str], *keys: str
              ) -> dict[str, tuple[str, str | None]]:
    return {k: (events[t[k]]["result"], events[t[k]].get("decline_reason")) for k in keys}


def test_a_duplicate_and_a_producer_retry_count_once(env, spawn_worker, tmp_path) -> None:
    t = lc.names("p1", "p2", "p3", "acc", "card", "lim")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
              [f"{t['lim']},CARD,{t['card']},DAY,100.00,2"])
    first = _at(lc.msg(t["p1"], "PURCHASE", t["acc"], "40.00", card_id=t["card"]),
                "2026-04-07T10:00:00Z")
    lc.run(env, spawn_worker, [
        first, first,  # redelivered
        _at(first, "2026-04-07T10:00:05Z", message_id="retry-" + t["p1"]),  # a retry
        _at(lc.msg(t["p2"], "PURCHASE", t["acc"], "40.00", card_id=t["card"]),
            "2026-04-07T11:00:00Z"),
        _at(lc.msg(t["p3"], "PURCHASE", t["acc"], "30.00", card_id=t["card"]),
            "2026-04-07T12:00:00Z"),
    ])
    events = lc.events(env, expect=3)
    # Counted once, the second fits (count 2 of 2); the third passes the amount (110 > 100).
    assert _outcomes(events, t, "p1", "p2", "p3") == {
        "p1": ("APPROVED", None), "p2": ("APPROVED", None),
        "p3": ("DECLINED", "LIMIT_EXCEEDED")}
    assert events[t["p3"]]["limit_id"] == t["lim"]
    assert _usage(env, t["lim"]) == {"2026-04-07": (80, 2)}
    lc.verified(env)


def test_a_message_counts_in_its_own_day_and_zone(env, spawn_worker, tmp_path) -> None:
    """Stamped 23:59:59 and decided long after midnight (months later, here): it counts in
    its own day; in New York, 00:00:01 UTC is still the evening before."""
    t = lc.names("late", "next", "same", "acc", "card", "lim", "ny_late", "ny_next", "acc2",
                 "card2", "lim2")
    lc.seed(env, (t["acc"], "1000.00"), (t["acc2"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}", f"{t['card2']},{t['acc2']}"],
              [f"{t['lim']},CARD,{t['card']},DAY,,1", f"{t['lim2']},CARD,{t['card2']},DAY,,1"])
    stamped = [
        _at(lc.msg(t["late"], "PURCHASE", t["acc"], "5.00", card_id=t["card"]),
            "2026-04-07T23:59:59Z"),
        _at(lc.msg(t["next"], "PURCHASE", t["acc"], "5.00", card_id=t["card"]),
            "2026-04-08T00:00:01Z"),
        _at(lc.msg(t["same"], "PURCHASE", t["acc"], "5.00", card_id=t["card"]),
            "2026-04-07T08:00:00Z"),
    ]
    first = lc.run(env, spawn_worker, stamped)
    events = lc.events(env, expect=3)
    assert _outcomes(events, t, "late", "next", "same") == {
        "late": ("APPROVED", None), "next": ("APPROVED", None),
        "same": ("DECLINED", "LIMIT_EXCEEDED")}
    assert _usage(env, t["lim"]) == {"2026-04-07": (5, 1), "2026-04-08": (5, 1)}

    # The same two moments in another zone: one day there, so the second is declined.
    assert first.terminate() == 0
    spawn_worker(env, name="ny", PAYAUTH_LIMITS_TIMEZONE="America/New_York")
    lc.send_more(env, [
        _at(lc.msg(t["ny_late"], "PURCHASE", t["acc2"], "5.00", card_id=t["card2"]),
            "2026-04-07T23:59:59Z"),
        _at(lc.msg(t["ny_next"], "PURCHASE", t["acc2"], "5.00", card_id=t["card2"]),
            "2026-04-08T00:00:01Z"),
    ])
    events = lc.events(env, expect=5)
    assert _outcomes(events, t, "ny_late", "ny_next") == {
        "ny_late": ("APPROVED", None), "ny_next": ("DECLINED", "LIMIT_EXCEEDED")}
    assert _usage(env, t["lim2"]) == {"2026-04-07": (5, 1)}
    lc.verified(env)


def test_a_limit_of_a_category_counts_only_that_category(env, spawn_worker,
                                                       tmp_path) -> None:
    """A card's daily ATM limit (category 6011) and an account's daily count of one meal
    (5812): a purchase of another category, or of none, is neither counted nor judged by
    them."""
    t = lc.names("atm1", "shop", "atm2", "meal1", "meal2", "none", "acc", "card", "atm",
                 "meals")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
              [f"{t['atm']},CARD,{t['card']},DAY,100.00,,6011",
               f"{t['meals']},ACCOUNT,{t['acc']},DAY,,1,5812"])

    def bought(key: str, amount: str, category: str | None) -> dict[str, Any]:
        fields = {} if category is None else {"merchant_category": category}
        return _at(lc.msg(t[key], "PURCHASE", t["acc"], amount, card_id=t["card"],
                          **fields), "2026-04-07T10:00:00Z")

    lc.run(env, spawn_worker, [
        bought("atm1", "80.00", "6011"), bought("shop", "500.00", "5411"),
        bought("atm2", "30.00", "6011"), bought("meal1", "10.00", "5812"),
        bought("meal2", "10.00", "5812"), bought("none", "5.00", None)])
    events = lc.events(env, expect=6)
    assert _outcomes(events, t, "atm1", "shop", "atm2", "meal1", "meal2", "none") == {
        "atm1": ("APPROVED", None), "shop": ("APPROVED", None),
        "atm2": ("DECLINED", "LIMIT_EXCEEDED"), "meal1": ("APPROVED", None),
        "meal2": ("DECLINED", "LIMIT_EXCEEDED"), "none": ("APPROVED", None)}
    assert _usage(env, t["atm"]) == {"2026-04-07": (80, 1)}
    assert _usage(env, t["meals"]) == {"2026-04-07": (10, 1)}
    lc.verified(env)


def test_two_messages_of_one_card_on_two_partitions_only_one_fitting_its_limit(
        env, spawn_worker, tmp_path) -> None:
    """The same card's purchases on two partitions (a gateway that keyed them otherwise),
    decided by two workers at once, the card's limit room for one: exactly one approved."""
    t = lc.names("a", "b", "acc", "card", "lim")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
              [f"{t['lim']},CARD,{t['card']},DAY,50.00,"])
    for key, partition in (("a", 0), ("b", 1)):
        message = _at(lc.msg(t[key], "PURCHASE", t["acc"], "30.00", card_id=t["card"]),
                      "2026-04-07T10:00:00Z")
        stack.produce(env.input_topic, [(t["acc"].encode(), encode(message))],
                      partition=partition)
    spawn_worker(env, name="one")
    spawn_worker(env, name="two")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    events = lc.events(env, expect=2)
    outcomes = sorted((events[t[k]]["result"], events[t[k]].get("decline_reason"))
                      for k in ("a", "b"))
    assert outcomes == [("APPROVED", None), ("DECLINED", "LIMIT_EXCEEDED")]
    assert _usage(env, t["lim"]) == {"2026-04-07": (30, 1)}
    lc.verified(env)


def _shadow_changes(env: stack.Env, tmp_path: Path) -> list[dict[str, Any]]:
    """What ``payauth replay --shadow`` over the whole stream says would change."""
    report = tmp_path / "shadow.json"
    done = payauth(env, "replay", "--shadow", "--to-earliest", "--json", str(report))
    assert done.returncode in (0, 3), done.stdout + done.stderr
    return json.loads(report.read_text())["changed"]


def test_explain_and_shadow_replay_read_the_usage_each_decision_read(env, spawn_worker,
                                                                    tmp_path) -> None:
    """What a decision read of its limits is kept with it, and `payauth explain` and `replay
    --shadow` read it there, not the usage as it stands by then: in the typed column a
    decision writes, and in the document a record decided before it kept. Each stored read
    is then altered, and the shadow replay follows it: it reads them."""
    t = lc.names("p1", "p2", "p3", "acc", "card", "lim")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
              [f"{t['lim']},CARD,{t['card']},DAY,100.00,5"])
    lc.run(env, spawn_worker, [_on_card(t, "p1", "PURCHASE", "40.00"),
                               _on_card(t, "p2", "PURCHASE", "50.00"),
                               _on_card(t, "p3", "PURCHASE", "30.00")])
    events = lc.events(env, expect=3)
    assert _outcomes(events, t, "p1", "p2", "p3") == {
        "p1": ("APPROVED", None), "p2": ("APPROVED", None),
        "p3": ("DECLINED", "LIMIT_EXCEEDED")}
    read_by_p2 = (f"limit        {t['lim']} (2026-04-07): amount 40.00 of 100.00, count 1 of 5 "
                  "before it\n")
    shown = lc.admin(env, "explain", t["p2"])
    assert read_by_p2 in shown, shown
    assert "count 2 of 5 before it  <- exceeded" in lc.admin(env, "explain", t["p3"])
    assert _shadow_changes(env, tmp_path) == []

    # p2's record as one decided before the typed column: its read in the document alone.
    stack.fetch(env.dsn, "UPDATE processed_transactions SET input_limits = "
                         "payauth_input_limits(input_limit_reads, NULL), "
                         "input_limit_reads = NULL WHERE txn_id = $1 RETURNING 1", t["p2"])
    assert read_by_p2 in lc.admin(env, "explain", t["p2"])
    assert _shadow_changes(env, tmp_path) == []

    # Each stored read altered as if the limit had been nearly full: the shadow replay
    # judges each by it, and would decline both.
    stack.fetch(env.dsn, "UPDATE processed_transactions SET input_limit_reads[1].used_amount "
                         "= 90 WHERE txn_id = $1 RETURNING 1", t["p1"])
    stack.fetch(env.dsn, "UPDATE processed_transactions SET input_limits = jsonb_set("
                         "input_limits, '{0,used_amount}', '90') WHERE txn_id = $1 "
                         "RETURNING 1", t["p2"])
    [changed] = _shadow_changes(env, tmp_path)
    assert changed["to"] == {"result": "DECLINED", "decline_reason": "LIMIT_EXCEEDED"}
    assert sorted(changed["transaction_ids"]) == sorted([t["p1"], t["p2"]])


def test_a_full_reversal_gives_the_usage_and_the_count_back(env, spawn_worker,
                                                            tmp_path) -> None:
    t = lc.names("hold", "rev", "after", "buy", "part", "last", "acc", "card", "lim")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
              [f"{t['lim']},CARD,{t['card']},DAY,100.00,2"])
    lc.run(env, spawn_worker, [_on_card(t, "hold", "AUTHORIZATION", "80.00")])
    assert _usage(env, t["lim"]) == {"2026-04-07": (80, 1)}
    lc.send_more(env, [_on_card(t, "rev", "REVERSAL", "80.00", t["hold"])])
    assert _usage(env, t["lim"]) == {"2026-04-07": (0, 0)}  # all of it, and its count
    lc.send_more(env, [_on_card(t, "after", "AUTHORIZATION", "90.00"),
                       _on_card(t, "buy", "PURCHASE", "10.00")])
    assert _usage(env, t["lim"]) == {"2026-04-07": (100, 2)}
    # A partial reversal of the purchase gives back what it credited, not its count.
    lc.send_more(env, [_on_card(t, "part", "REVERSAL", "4.00", t["buy"]),
                       _on_card(t, "last", "PURCHASE", "4.00")])
    events = lc.events(env, expect=6)
    assert _outcomes(events, t, "hold", "after", "buy", "last") == {
        "hold": ("APPROVED", None), "after": ("APPROVED", None), "buy": ("APPROVED", None),
        "last": ("DECLINED", "LIMIT_EXCEEDED")}  # 96 + 4 fits, but not a third purchase
    assert _usage(env, t["lim"]) == {"2026-04-07": (96, 2)}
    lc.verified(env)


def test_a_reversal_of_an_increments_whole_amount_keeps_the_counts(env, spawn_worker,
                                                                   tmp_path) -> None:
    """A hold of 50 and its increment of 20 count 70 and 2. A partial reversal of 20 takes
    the increment's amount back (the increments first) but no count: the authorization
    stands (seen failing with the increment's count given back when its charge was given
    back whole). The reversal of the rest is full: the counts go back too."""
    t = lc.names("hold", "inc", "part", "rest", "acc", "card", "lim")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
              [f"{t['lim']},CARD,{t['card']},DAY,500.00,10"])
    lc.run(env, spawn_worker, [_on_card(t, "hold", "AUTHORIZATION", "50.00"),
                               _on_card(t, "inc", "INCREMENTAL", "20.00", t["hold"])])
    assert _usage(env, t["lim"]) == {"2026-04-07": (70, 2)}
    lc.send_more(env, [_on_card(t, "part", "REVERSAL", "20.00", t["hold"])])
    assert _usage(env, t["lim"]) == {"2026-04-07": (50, 2)}
    lc.send_more(env, [_on_card(t, "rest", "REVERSAL", "50.00", t["hold"])])
    assert _usage(env, t["lim"]) == {"2026-04-07": (0, 0)}
    events = lc.events(env, expect=4)
    assert _outcomes(events, t, "hold", "inc", "part", "rest") == {
        k: ("APPROVED", None) for k in ("hold", "inc", "part", "rest")}
    lc.verified(env)


def test_a_partial_reversal_keeps_the_count_of_an_increment_counted_alone(
        env, spawn_worker, tmp_path) -> None:
    """A hold of 50 placed before its card had a limit, then an increment of 20 counted
    alone (20 and 1). A partial reversal of 20 takes the increment's amount back, not its
    count: the hold stands (seen failing with the count given back, the increment's charge
    being all the limit had counted under the hold). The reversal of the rest ends the
    hold: the count goes back too."""
    t = lc.names("hold", "inc", "part", "rest", "acc", "card", "lim")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"], [])
    lc.run(env, spawn_worker, [_on_card(t, "hold", "AUTHORIZATION", "50.00")])
    lc.controls(env, tmp_path, [], [f"{t['lim']},CARD,{t['card']},DAY,500.00,10"])
    lc.send_more(env, [_on_card(t, "inc", "INCREMENTAL", "20.00", t["hold"])])
    assert _usage(env, t["lim"]) == {"2026-04-07": (20, 1)}
    lc.send_more(env, [_on_card(t, "part", "REVERSAL", "20.00", t["hold"])])
    assert _usage(env, t["lim"]) == {"2026-04-07": (0, 1)}
    lc.send_more(env, [_on_card(t, "rest", "REVERSAL", "50.00", t["hold"])])
    assert _usage(env, t["lim"]) == {"2026-04-07": (0, 0)}
    events = lc.events(env, expect=4)
    assert _outcomes(events, t, "hold", "inc", "part", "rest") == {
        k: ("APPROVED", None) for k in ("hold", "inc", "part", "rest")}
    lc.verified(env)


def test_a_partial_reversal_gives_back_the_latest_increment_first(env, spawn_worker,
                                                                   tmp_path) -> None:
    """A hold of 50 on Tuesday, increments of 20 on Wednesday and 10 on Thursday, each
    counted in its own day. Reversals of 10, then 20, then 15 give back Thursday's, then
    Wednesday's, then part of Tuesday's: the last added is the first released (and no count
    while the hold stands)."""
    t = lc.names("hold", "wed", "thu", "r1", "r2", "r3", "acc", "card", "lim")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
              [f"{t['lim']},CARD,{t['card']},DAY,500.00,10"])
    lc.run(env, spawn_worker, [
        _on_card(t, "hold", "AUTHORIZATION", "50.00", at="2026-04-07T10:00:00Z"),
        _on_card(t, "wed", "INCREMENTAL", "20.00", t["hold"], at="2026-04-08T10:00:00Z"),
        _on_card(t, "thu", "INCREMENTAL", "10.00", t["hold"], at="2026-04-09T10:00:00Z")])
    assert _usage(env, t["lim"]) == {
        "2026-04-07": (50, 1), "2026-04-08": (20, 1), "2026-04-09": (10, 1)}
    friday = "2026-04-10T10:00:00Z"
    lc.send_more(env, [_on_card(t, "r1", "REVERSAL", "10.00", t["hold"], at=friday)])
    assert _usage(env, t["lim"]) == {
        "2026-04-07": (50, 1), "2026-04-08": (20, 1), "2026-04-09": (0, 1)}
    lc.send_more(env, [_on_card(t, "r2", "REVERSAL", "20.00", t["hold"], at=friday)])
    assert _usage(env, t["lim"]) == {
        "2026-04-07": (50, 1), "2026-04-08": (0, 1), "2026-04-09": (0, 1)}
    lc.send_more(env, [_on_card(t, "r3", "REVERSAL", "15.00", t["hold"], at=friday)])
    assert _usage(env, t["lim"]) == {
        "2026-04-07": (35, 1), "2026-04-08": (0, 1), "2026-04-09": (0, 1)}
    events = lc.events(env, expect=6)
    assert {k: events[t[k]]["result"] for k in ("hold", "wed", "thu", "r1", "r2", "r3")} \
        == dict.fromkeys(("hold", "wed", "thu", "r1", "r2", "r3"), "APPROVED")
    lc.verified(env)


def test_an_advice_naming_a_card_of_another_account_counts_in_no_limit_of_that_card(
        env, spawn_worker, tmp_path) -> None:
    """An advice is never declined, so one naming another account's card is placed: it
    counts in its own account's limit, never in that card's."""
    t = lc.names("advice", "acc", "acc2", "card2", "lim2", "mine")
    lc.seed(env, (t["acc"], "1000.00"), (t["acc2"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card2']},{t['acc2']}"],
              [f"{t['lim2']},CARD,{t['card2']},DAY,100.00,5",
               f"{t['mine']},ACCOUNT,{t['acc']},DAY,100.00,5"])
    lc.run(env, spawn_worker, [_at(lc.msg(t["advice"], "ADVICE", t["acc"], "30.00",
                                          card_id=t["card2"]), "2026-04-07T10:00:00Z")])
    events = lc.events(env, expect=1)
    assert events[t["advice"]]["result"] == "APPROVED"
    assert _usage(env, t["lim2"]) == {}
    assert _usage(env, t["mine"]) == {"2026-04-07": (30, 1)}
    lc.verified(env)


def test_a_limit_id_loaded_by_another_command_meanwhile_loads_nothing(env) -> None:
    """Two connections: another command has inserted limit L (an account's, per month) and
    not committed; `limits load` of L as a card's daily limit checks before it (L not seen),
    then waits for L's row; the other commits. The load refuses the line and loads nothing,
    and L keeps what it counts and its maximum (seen failing: the load set its maximum on the
    other command's limit and said it loaded)."""
    t = lc.names("acc", "card", "lim", "other")
    lc.seed(env, (t["acc"], "1000.00"))
    stack.fetch(env.dsn, "INSERT INTO cards (card_id, account_id) VALUES ($1, $2) RETURNING 1",
                t["card"], t["acc"])
    rows = limits.parse(f"{t['lim']},CARD,{t['card']},DAY,100.00,\n"
                        f"{t['other']},CARD,{t['card']},MONTH,800.00,\n")

    async def scenario() -> list[str]:
        other = await asyncpg.connect(env.dsn)
        try:
            tx = other.transaction()
            await tx.start()
            await other.execute(
                "INSERT INTO spending_limits (limit_id, scope, scope_id, period, max_amount) "
                "VALUES ($1, 'ACCOUNT', $2, 'MONTH', 900)", t["lim"], t["acc"])
            loading = asyncio.create_task(limits.load(env.dsn, rows))
            await stack.until_a_lock_is_awaited(env.dsn)
            await tx.commit()
            with pytest.raises(csv_file.FileInvalid) as refused:
                await loading
            return refused.value.problems
        finally:
            await other.close()

    problems = asyncio.run(scenario())
    assert len(problems) == 1 and problems[0].startswith("line 1: limit_id ")
    assert "loaded meanwhile" in problems[0]
    kept = stack.fetch(env.dsn, "SELECT limit_id, scope, period, max_amount "
                                "FROM spending_limits WHERE limit_id = ANY($1) ORDER BY 1",
                       [t["lim"], t["other"]])
    assert [(r["limit_id"], r["scope"], r["period"], r["max_amount"]) for r in kept] == [
        (t["lim"], "ACCOUNT", "MONTH", 900)]


def test_a_card_frozen_between_two_messages(env, spawn_worker, tmp_path) -> None:
    """Frozen by `payauth cards status` between two purchases: the second is declined and
    its event names the status; a clearing and a reversal on the frozen card are applied;
    an advice past a limit is placed and counted; who froze it is kept."""
    t = lc.names("before", "hold", "after", "clear", "rev", "advice", "verify", "acc", "card",
                 "lim", "hold2")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
              [f"{t['lim']},CARD,{t['card']},DAY,150.00,"])
    lc.run(env, spawn_worker, [_on_card(t, "before", "PURCHASE", "20.00"),
                               _on_card(t, "hold", "AUTHORIZATION", "50.00"),
                               _on_card(t, "hold2", "AUTHORIZATION", "30.00")])
    said = lc.admin(env, "cards", "status", t["card"], "FROZEN", "--reason", "lost in a taxi",
                  "--by", "agent-7")
    assert "ACTIVE -> FROZEN" in said
    lc.send_more(env, [_on_card(t, "after", "PURCHASE", "5.00"),
                       _on_card(t, "verify", "VERIFICATION", "0.00"),
                       _on_card(t, "clear", "CLEARING", "50.00", t["hold"]),
                       _on_card(t, "rev", "REVERSAL", "30.00", t["hold2"]),
                       _on_card(t, "advice", "ADVICE", "200.00")])
    events = lc.events(env, expect=8)
    assert _outcomes(events, t, "after", "verify", "clear", "rev", "advice") == {
        "after": ("DECLINED", "CARD_BLOCKED"), "verify": ("DECLINED", "CARD_BLOCKED"),
        "clear": ("APPROVED", None), "rev": ("APPROVED", None), "advice": ("APPROVED", None)}
    assert events[t["after"]]["card_status"] == "FROZEN"
    assert events[t["rev"]]["amount_applied"] == "30.00"
    # 20 + 50 + 30, less the 30 reversed, plus the advice's 200: past the limit, counted.
    assert _usage(env, t["lim"]) == {"2026-04-07": (270, 3)}
    changes = stack.fetch(env.dsn, "SELECT old_status, new_status, reason, changed_by "
                                   "FROM card_status_changes WHERE card_id = $1", t["card"])
    assert [tuple(c) for c in changes] == [("ACTIVE", "FROZEN", "lost in a taxi", "agent-7")]
    explained = payauth(env, "explain", t["after"]).stdout
    assert f"card         {t['card']}, status FROZEN" in explained, explained
    lc.verified(env)


def test_expired_cards_blocked_merchants_and_unknown_cards(env, spawn_worker,
                                                           tmp_path) -> None:
    t = lc.names("expired", "valid", "gambling", "country", "other", "nobody", "refund",
                 "plain", "acc", "acc2", "card", "old", "card2")
    lc.seed(env, (t["acc"], "1000.00"), (t["acc2"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}",
                              f"{t['old']},{t['acc']},ACTIVE,2026-04-06",
                              f"{t['card2']},{t['acc2']}"], [])
    _blocks(env, ("CARD", t["card"], "CATEGORY", "7995"), ("ACCOUNT", t["acc"], "COUNTRY", "KP"))
    day = "2026-04-07T10:00:00Z"
    lc.run(env, spawn_worker, [
        _at(lc.msg(t["expired"], "PURCHASE", t["acc"], "5.00", card_id=t["old"]), day),
        _at(lc.msg(t["valid"], "PURCHASE", t["acc"], "5.00", card_id=t["old"]),
            "2026-04-06T21:00:00Z"),  # its last valid day
        _at(lc.msg(t["gambling"], "PURCHASE", t["acc"], "5.00", card_id=t["card"],
                   merchant_category="7995"), day),
        _at(lc.msg(t["country"], "AUTHORIZATION", t["acc"], "5.00", card_id=t["card"],
                   merchant_country="KP"), day),
        _at(lc.msg(t["other"], "PURCHASE", t["acc"], "5.00", card_id=t["card2"]), day),
        _at(lc.msg(t["nobody"], "PURCHASE", t["acc"], "5.00", card_id="NO-SUCH-CARD"), day),
        _at(lc.msg(t["refund"], "REFUND", t["acc"], "5.00", card_id=t["old"]), day),
        _at(lc.msg(t["plain"], "PURCHASE", t["acc"], "5.00", merchant_country="ES"), day),
    ])
    events = lc.events(env, expect=8)
    assert _outcomes(events, t, "expired", "valid", "gambling", "country", "other", "nobody",
                     "refund", "plain") == {
        "expired": ("DECLINED", "CARD_EXPIRED"), "valid": ("APPROVED", None),
        "gambling": ("DECLINED", "CATEGORY_BLOCKED"),
        "country": ("DECLINED", "COUNTRY_BLOCKED"), "other": ("DECLINED", "UNKNOWN_CARD"),
        "nobody": ("DECLINED", "UNKNOWN_CARD"), "refund": ("APPROVED", None),
        "plain": ("APPROVED", None)}
    lc.verified(env)


def test_a_decline_names_the_first_control_in_the_contracts_order(env, spawn_worker,
                                                                  tmp_path) -> None:
    """A frozen card past its expiry is CARD_BLOCKED (the status before the expiry); a
    purchase in a blocked category and a blocked country is CATEGORY_BLOCKED."""
    t = lc.names("frozen_old", "both", "acc", "card", "old")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}",
                              f"{t['old']},{t['acc']},FROZEN,2026-04-06"], [])
    _blocks(env, ("CARD", t["card"], "CATEGORY", "7995"), ("ACCOUNT", t["acc"], "COUNTRY", "KP"))
    day = "2026-04-07T10:00:00Z"
    lc.run(env, spawn_worker, [
        _at(lc.msg(t["frozen_old"], "PURCHASE", t["acc"], "5.00", card_id=t["old"]), day),
        _at(lc.msg(t["both"], "PURCHASE", t["acc"], "5.00", card_id=t["card"],
                   merchant_category="7995", merchant_country="KP"), day)])
    events = lc.events(env, expect=2)
    assert _outcomes(events, t, "frozen_old", "both") == {
        "frozen_old": ("DECLINED", "CARD_BLOCKED"), "both": ("DECLINED", "CATEGORY_BLOCKED")}


def test_a_partial_approval_is_judged_by_the_limit_on_what_it_approves(
        env, spawn_worker, tmp_path) -> None:
    """100.00 asked, partial approval accepted, 60.00 available: approved for 60.00 where
    the day's limit has 80.00 left (what it approves fits, what it asked would not), and
    declined whole where it has 50.00 left (a limit never partially approves)."""
    t = lc.names("fits", "past", "acc", "acc2", "card", "card2", "lim", "lim2")
    lc.seed(env, (t["acc"], "60.00"), (t["acc2"], "60.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}", f"{t['card2']},{t['acc2']}"],
              [f"{t['lim']},CARD,{t['card']},DAY,80.00,", f"{t['lim2']},CARD,{t['card2']},"
               "DAY,50.00,"])
    day = "2026-04-07T10:00:00Z"
    lc.run(env, spawn_worker, [
        _at(lc.msg(t["fits"], "PURCHASE", t["acc"], "100.00", card_id=t["card"],
                   partial_approval_supported=True), day),
        _at(lc.msg(t["past"], "PURCHASE", t["acc2"], "100.00", card_id=t["card2"],
                   partial_approval_supported=True), day)])
    events = lc.events(env, expect=2)
    assert _outcomes(events, t, "fits", "past") == {
        "fits": ("APPROVED", None), "past": ("DECLINED", "LIMIT_EXCEEDED")}
    assert (events[t["fits"]]["amount_approved"], events[t["fits"]]["partial"]) == \
        ("60.00", True)
    assert _usage(env, t["lim"]) == {"2026-04-07": (60, 1)}
    assert _usage(env, t["lim2"]) == {}
    lc.verified(env)


def test_a_weekly_limit_counts_from_monday(env, spawn_worker, tmp_path) -> None:
    """One purchase a week: Sunday's, then Monday's (a new week) are approved, Tuesday's
    declined."""
    t = lc.names("sun", "mon", "tue", "acc", "card", "lim")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
              [f"{t['lim']},CARD,{t['card']},WEEK,,1"])
    lc.run(env, spawn_worker, [
        _on_card(t, "sun", "PURCHASE", "5.00", at="2026-04-12T10:00:00Z"),
        _on_card(t, "mon", "PURCHASE", "5.00", at="2026-04-13T10:00:00Z"),
        _on_card(t, "tue", "PURCHASE", "5.00", at="2026-04-14T10:00:00Z")])
    events = lc.events(env, expect=3)
    assert _outcomes(events, t, "sun", "mon", "tue") == {
        "sun": ("APPROVED", None), "mon": ("APPROVED", None),
        "tue": ("DECLINED", "LIMIT_EXCEEDED")}
    assert _usage(env, t["lim"]) == {"2026-04-06": (5, 1), "2026-04-13": (5, 1)}


def test_an_accounts_blocks_judge_messages_that_name_no_card(env, spawn_worker) -> None:
    """Blocks of an account (a country, a category) and messages that name no card, none
    in their batch: each blocked as the contract says, the rest approved."""
    t = lc.names("country", "category", "plain", "acc")
    lc.seed(env, (t["acc"], "1000.00"))
    _blocks(env, ("ACCOUNT", t["acc"], "COUNTRY", "KP"),
            ("ACCOUNT", t["acc"], "CATEGORY", "7995"))
    day = "2026-04-07T10:00:00Z"
    lc.run(env, spawn_worker, [
        _at(lc.msg(t["country"], "PURCHASE", t["acc"], "5.00", merchant_country="KP"), day),
        _at(lc.msg(t["category"], "AUTHORIZATION", t["acc"], "5.00",
                   merchant_category="7995"), day),
        _at(lc.msg(t["plain"], "PURCHASE", t["acc"], "5.00", merchant_country="ES",
                   merchant_category="5411"), day)])
    events = lc.events(env, expect=3)
    assert _outcomes(events, t, "country", "category", "plain") == {
        "country": ("DECLINED", "COUNTRY_BLOCKED"),
        "category": ("DECLINED", "CATEGORY_BLOCKED"), "plain": ("APPROVED", None)}
    lc.verified(env)


def test_the_commands_refuse_bad_input_with_one_line_and_change_nothing(env,
                                                                        tmp_path) -> None:
    t = lc.names("acc", "card", "lim")
    lc.seed(env, (t["acc"], "10.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"], [])
    refused = [
        ("cards", "status", "NO-SUCH-" + t["card"], "FROZEN", "--reason", "x"),
        ("cards", "status", t["card"], "MELTED", "--reason", "x"),
    ]
    for args in refused:
        done = payauth(env, *args, PAYAUTH_DATABASE_URL=env.dsn)
        assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done
    (tmp_path / "bad.csv").write_text(f"{t['lim']},CARD,{t['card']},DAY,10.00,\n"
                                      f"{t['lim']}-2,CARD,{t['card']},YEARLY,10.00,\n")
    done = payauth(env, "limits", "load", str(tmp_path / "bad.csv"),
                   PAYAUTH_DATABASE_URL=env.dsn)
    assert done.returncode == 1 and "line 2: period must be one of" in done.stderr, done
    (tmp_path / "bad-cards.csv").write_text(f"X-{t['card']},NO-SUCH-{t['acc']}\n")
    done = payauth(env, "cards", "load", str(tmp_path / "bad-cards.csv"),
                   PAYAUTH_DATABASE_URL=env.dsn)
    assert done.returncode == 1 and "line 1: account_id NO-SUCH-" in done.stderr, done
    assert stack.fetch(env.dsn, "SELECT status FROM cards WHERE card_id = $1",
                       t["card"])[0]["status"] == "ACTIVE"
    assert not stack.fetch(env.dsn, "SELECT 1 FROM spending_limits WHERE limit_id LIKE $1",
                           t["lim"] + "%")
    assert not stack.fetch(env.dsn, "SELECT 1 FROM card_status_changes WHERE card_id = $1",
                           t["card"])
    bad_zone = payauth(env, "limits", "show", "--card", t["card"],
                       PAYAUTH_LIMITS_TIMEZONE="Mars/Olympus")
    assert bad_zone.returncode == 2 and "PAYAUTH_LIMITS_TIMEZONE" in bad_zone.stderr
    shown = payauth(env, "limits", "show", "--card", t["card"]).stdout
    assert shown.strip() == "limits: none"


def test_blocks_are_loaded_shown_and_lifted_by_command(env, spawn_worker, tmp_path) -> None:
    """`payauth blocks load` blocks gambling on a card and a country on its account: both
    declined; `blocks show` lists them for the card; `blocks lift` lifts the category, and
    the next gambling purchase is approved. A file with a lowercase country, a category of
    three digits and a card that does not exist names each line, and changes nothing."""
    t = lc.names("bet", "trip", "bet2", "acc", "card")
    lc.seed(env, (t["acc"], "1000.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"], [])
    (tmp_path / "bad.csv").write_text(f"scope,scope_id,kind,value\n"
                                      f"ACCOUNT,{t['acc']},COUNTRY,kp\n"
                                      f"CARD,{t['card']},CATEGORY,799\n")
    done = payauth(env, "blocks", "load", str(tmp_path / "bad.csv"),
                   PAYAUTH_DATABASE_URL=env.dsn)
    assert done.returncode == 1, done
    assert "blocks: line 2: a country is two capital letters" in done.stderr, done.stderr
    assert "blocks: line 3: a category is four digits" in done.stderr, done.stderr
    (tmp_path / "nobody.csv").write_text(f"CARD,NO-SUCH-{t['card']},CATEGORY,7995\n")
    done = payauth(env, "blocks", "load", str(tmp_path / "nobody.csv"),
                   PAYAUTH_DATABASE_URL=env.dsn)
    assert done.returncode == 1 and "line 1: card NO-SUCH-" in done.stderr, done
    assert not stack.fetch(env.dsn, "SELECT 1 FROM card_blocks WHERE scope_id = ANY($1)",
                           [t["acc"], t["card"]])

    (tmp_path / "blocks.csv").write_text(f"CARD,{t['card']},CATEGORY,7995\n"
                                         f"ACCOUNT,{t['acc']},COUNTRY,KP\n")
    assert lc.admin(env, "blocks", "load", str(tmp_path / "blocks.csv")).strip() == \
        "blocks: 2 new, 0 already there"
    assert lc.admin(env, "blocks", "load", str(tmp_path / "blocks.csv")).strip() == \
        "blocks: 0 new, 2 already there"
    assert payauth(env, "blocks", "show", "--card", t["card"]).stdout.splitlines() == [
        f"CARD {t['card']}: CATEGORY 7995", f"ACCOUNT {t['acc']}: COUNTRY KP"]
    day = "2026-04-07T10:00:00Z"
    worker = lc.run(env, spawn_worker, [
        _at(lc.msg(t["bet"], "PURCHASE", t["acc"], "5.00", card_id=t["card"],
                   merchant_category="7995"), day),
        _at(lc.msg(t["trip"], "PURCHASE", t["acc"], "5.00", card_id=t["card"],
                   merchant_country="KP"), day)])
    (tmp_path / "lift.csv").write_text(f"CARD,{t['card']},CATEGORY,7995\n")
    lc.events(env, expect=2)
    assert lc.admin(env, "blocks", "lift", str(tmp_path / "lift.csv")).strip() == \
        "blocks: 1 lifted, 0 were not there"
    lc.send_more(env, [_at(lc.msg(t["bet2"], "PURCHASE", t["acc"], "5.00", card_id=t["card"],
                                  merchant_category="7995"), day)])
    events = lc.events(env, expect=3)
    assert _outcomes(events, t, "bet", "trip", "bet2") == {
        "bet": ("DECLINED", "CATEGORY_BLOCKED"), "trip": ("DECLINED", "COUNTRY_BLOCKED"),
        "bet2": ("APPROVED", None)}
    assert payauth(env, "blocks", "show", "--account", t["acc"]).stdout.splitlines() == [
        f"ACCOUNT {t['acc']}: COUNTRY KP"]
    assert worker.alive()
    lc.verified(env)


def test_the_gauges_name_the_frozen_cards_and_the_limits_nearest_their_ceiling(
        env, tmp_path) -> None:
    """What the worker's gauges read each minute (``PostgresStore.controls_gauges``): the
    cards that are not ACTIVE by status, the limits nearest their ceiling now."""
    import asyncio
    from datetime import UTC, datetime

    from service.adapters.postgres import PostgresStore

    t = lc.names("acc", "card", "lost", "lim", "lim2")
    lc.seed(env, (t["acc"], "10.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}", f"{t['lost']},{t['acc']},LOST"],
              [f"{t['lim']},CARD,{t['card']},DAY,100.00,", f"{t['lim2']},CARD,{t['card']},"
               "MONTH,,10"])
    today = datetime.now(UTC).date()
    stack.fetch(env.dsn, "INSERT INTO limit_usage (limit_id, period_start, amount, count) "
                         "VALUES ($1, $3, 90, 1), ($2, date_trunc('month', $3::date), 2, 2) "
                         "RETURNING 1", t["lim"], t["lim2"], today)

    async def read() -> dict[str, Any]:
        store = await PostgresStore.connect(env.dsn)
        try:
            return await store.controls_gauges("UTC")
        finally:
            await store.close()

    gauges = asyncio.run(read())
    assert dict(zip(gauges["statuses"], gauges["counts"], strict=True))["LOST"] >= 1
    ratios = dict(zip(gauges["limit_ids"], gauges["ratios"], strict=True))
    assert (ratios.get(t["lim"]), ratios.get(t["lim2"])) == (0.9, 0.2), ratios
