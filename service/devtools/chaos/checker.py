"""The checker: holds the database, the output and dead-letter topics and Redis against the
load generator's ground-truth log, the way Jepsen's checkers count lost, duplicated and
unseen operations. ``payauth-dev check LOG`` runs it.

Every message sent must be accounted for exactly once:
- *decided*: it is the message the dedup record names as its source (partition, offset);
- *dead-lettered*: a DLQ record names it as its source (invalid input, conflicts);
- *duplicate*: another message with the same transaction_id and payload was decided.
A message that is none of these was lost; one that is two of them was handled twice.

The money is held to what the log implies (lifecycle_model.py, the contract's rules
modelled apart from the SQL): every account's ledger balance, held and available amounts
(the view ``account_balances``), every transaction's ledger entry (a partial approval's and
a conversion's as approved), every hold's amount, increments, state and its one end
(``holds.state``/``ended_by`` against the messages that say they ended it,
``lifecycle_messages.ended_hold``). Expiry is the one effect not in the log: the holds the
database says EXPIRED are taken from it, and held to what an expiry may do (end an active
hold, release what remained at some point of its life, not before its age; one
``HoldExpired`` each; an increment after it declined HOLD_NOT_ACTIVE).

The output topic alone, each ``event_id`` counted once, must rebuild every account's ledger
balance and held amount as the database has them (rebuild.py): what a downstream consumer
with no access to the database relies on.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import redis
import redis.sentinel

from service.adapters.kafka.admin import group_lag, read_snapshot
from service.adapters.kafka.config import client_config
from service.adapters.redis_cache import BUCKET_PREFIX, master_options, sentinel_options
from service.config import Settings
from service.devtools.chaos.cards import limit_findings, toggle_findings
from service.devtools.chaos.database_state import database_state
from service.devtools.chaos.lifecycle_model import Expected, implied_by
from service.devtools.chaos.rebuild import Finding, rebuilt_from_events, reversals_applied
from service.domain.dedup import read_fast_path_value
from service.domain.events import event_time
from service.ops.verify import verify


@dataclass
class Report:
    findings: list[Finding]
    accounted: dict[str, int]
    lifecycle: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)

    def render(self) -> str:
        lines = []
        for f in self.findings:
            if f.ok:
                lines.append(f"PASS  {f.name}")
            else:
                lines.append(f"FAIL  {f.name}: {len(f.violations)} violation(s), e.g. "
                             + "; ".join(f.violations[:3]))
        lines.append("checker: all invariants hold" if self.ok else
                     "checker: INVARIANTS VIOLATED")
        return "\n".join(lines)


def read_log(path: Path) -> list[dict[str, Any]]:
    with path.open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_all(settings: Settings, topic: str) -> list[Any]:
    return read_snapshot({**client_config(settings), "group.id": f"{settings.group_id}.checker"},
                         topic)


def _redis(settings: Settings) -> redis.Redis:
    """The Redis the workers write: the master the Sentinels name, when they are set."""
    if settings.redis_sentinels:
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            settings.sentinel_addresses(), socket_timeout=5,
            sentinel_kwargs=sentinel_options(
                settings.redis_url.get_secret_value(),
                settings.redis_sentinel_password.get_secret_value(), 5))
        return sentinel.master_for(  # type: ignore[no-untyped-call,no-any-return]
            settings.redis_sentinel_master, decode_responses=True, socket_timeout=5,
            **master_options(settings.redis_url.get_secret_value()))
    return redis.Redis.from_url(settings.redis_url.get_secret_value(), decode_responses=True,
                                socket_timeout=5)


def check(settings: Settings, log_path: Path, *, redis_prefix: str | None = None,
          hold_expiry_hours: float | None = None,
          purged: dict[str, dict[str, Any]] | None = None,
          card_changes: int | None = None) -> Report:
    """``hold_expiry_hours``: the run's ``PAYAUTH_HOLD_EXPIRY_HOURS``, below which no hold
    may have expired (None: not checked). ``purged``: the dedup records ``payauth purge``
    may have deleted during the run, as they were read just before it (a superset of what
    it deleted): decisions all the same, held to everything a record still there is.
    ``card_changes``: how many status changes the run started on its toggled card (None:
    unknown; cards.py)."""
    log = read_log(log_path)
    dsn = settings.database_url.get_secret_value()
    dlq = read_all(settings, settings.dlq_topic)
    output = read_all(settings, settings.output_topic)
    # the transactions the log names and those an event names (a message whose delivery
    # report was lost, one that should have been refused): every one is looked up
    txns = sorted({m["txn"] for m in log if m["txn"]}
                  | {json.loads(rec.value())["transaction_id"] for rec in output})
    db = asyncio.run(database_state(dsn, txns, sorted({m["key"] for m in log})))
    processed, ledger = {**(purged or {}), **db["processed"]}, db["ledger"]
    model = implied_by(log)

    findings: list[Finding] = []

    # --- the consumer group reached the end
    lag = Finding("lag is zero (every offset committed)")
    for p, behind in group_lag(client_config(settings), settings.group_id,
                               settings.input_topic).items():
        if behind:
            lag.violations.append(f"partition {p}: {behind} message(s) not committed")
    findings.append(lag)

    # --- DLQ records: reason and source
    dlq_found = Finding("every DLQ record carries its reason and source offset")
    dead: dict[tuple[int, int], set[str]] = defaultdict(set)
    for rec in dlq:
        headers = {k: v.decode() for k, v in (rec.headers() or [])}
        if not headers.get("error.reason") or "source.offset" not in headers:
            dlq_found.violations.append(f"dlq {rec.partition()}/{rec.offset()} lacks headers")
            continue
        if headers.get("source.topic") == settings.input_topic:
            source = (int(headers["source.partition"]), int(headers["source.offset"]))
            dead[source].add(headers["error.reason"])
    findings.append(dlq_found)

    # --- every message accounted for exactly once
    accounting = Finding("every message sent is accounted for exactly once")
    wrong_dlq = Finding("no valid message is in the DLQ; invalid ones carry the right reason")
    accounted: dict[str, int] = defaultdict(int)
    first_fp: dict[str, str] = {}
    for m in sorted(log, key=lambda m: m["seq"]):
        if m["txn"] and m["expect"] in ("approved", "declined"):
            first_fp.setdefault(m["txn"], m["fp"])
    for m in log:
        where = (m["partition"], m["offset"])
        in_dlq = dead.get(where, set())
        row = processed.get(m["txn"]) if m["txn"] else None
        decided = row is not None and (row["source_partition"], row["source_offset"]) == where
        duplicate = (row is not None and not decided and row["fingerprint"] == m["fp"]) or \
            (row is None and m["txn"] and ledger.get(m["txn"]) and m["expect"] == "approved")
        states = [s for s, on in (("decided", decided), ("dead-lettered", bool(in_dlq)),
                                  ("duplicate", bool(duplicate))) if on]
        if len(states) != 1:
            accounting.violations.append(
                f"{m['kind']} {m['txn']} at {where}: {' and '.join(states) or 'LOST'}")
            continue
        state = states[0]
        if m["expect"] in ("invalid", "conflict"):
            if state != "dead-lettered" or m["reason"] not in in_dlq:
                wrong_dlq.violations.append(f"{m['kind']} at {where}: {state} {sorted(in_dlq)}")
            accounted["conflict" if m["expect"] == "conflict" else "dead-lettered"] += 1
        else:
            if state == "dead-lettered":
                wrong_dlq.violations.append(f"valid {m['kind']} {m['txn']} in the DLQ: {in_dlq}")
                accounted["dead-lettered"] += 1
            elif state == "duplicate" or row is None:
                accounted["duplicate"] += 1
            else:
                accounted[str(row["result"]).lower()] += 1
    findings += [accounting, wrong_dlq]

    # --- per transaction: decided once, rightly, first payload, ledger
    decisions = Finding("each transaction decided once, as expected, on its first payload")
    money = Finding("each transaction has the ledger entry the log implies (a posting's "
                    "amount), others none")
    expected: dict[str, str] = {}
    sent: dict[str, dict[str, Any]] = {}
    for m in log:
        if m["txn"] and m["expect"] in ("approved", "declined"):
            expected[m["txn"]] = m["expect"]
            sent.setdefault(m["txn"], m)
    for txn, want in expected.items():
        row = processed.get(txn)
        if row is None:
            if not (want == "approved" and ledger.get(txn)):  # purged record, ledger guards
                decisions.violations.append(f"{txn}: never decided")
            continue
        assert row is not None
        if sent[txn].get("toggle"):
            pass  # judged by the status it read: toggle_findings below
        elif row["result"].lower() != want and \
                not expired_first(sent[txn], row, db["holds"]):
            decisions.violations.append(f"{txn}: {row['result']} but expected {want}")
        if row["fingerprint"] != first_fp[txn]:
            decisions.violations.append(f"{txn}: stored payload is not the first one sent")
    for txn in expected_txns(log):
        entries, posting = db["amounts"].get(txn, []), model.ledger.get(txn)
        if entries != ([] if posting is None else [posting]):
            money.violations.append(f"{txn}: ledger {[str(e) for e in entries]}, the log "
                                    f"implies {'none' if posting is None else posting}")
    findings += [decisions, money]
    findings += lifecycle_findings(model, db, hold_expiry_hours)
    findings += [limit_findings(log, db["usage"]),
                 toggle_findings(log, processed, card_changes)]

    # --- the output topic
    events = Finding("an event for every decided transaction; repeats identical")
    by_txn: dict[str, list[dict[str, Any]]] = defaultdict(list)
    expiries: dict[str, list[dict[str, Any]]] = defaultdict(list)
    applied: dict[str, list[dict[str, Any]]] = defaultdict(list)  # ReversalApplied
    published = [json.loads(rec.value()) for rec in output]
    for event in published:
        kind = event["event_type"]
        (expiries if kind == "HoldExpired" else applied if kind == "ReversalApplied"
         else by_txn)[event["transaction_id"]].append(event)
    for txn, row in processed.items():
        seen = by_txn.get(txn)
        if not seen:
            events.violations.append(f"{txn}: no event")
        elif any(e != seen[0] for e in seen) or seen[0]["result"] != row["result"]:
            events.violations.append(f"{txn}: {len(seen)} events differ or disagree with DB")
    findings.append(events)

    # --- an expiry's event: one per expired hold (republications the same), none for another
    expiry_events = Finding("a HoldExpired for every expired hold, with what it released; "
                            "none for another")
    for txn, hold in db["holds"].items():
        seen = expiries.get(txn, [])
        if hold["state"] != "EXPIRED":
            if seen:
                expiry_events.violations.append(f"{txn}: HoldExpired for a {hold['state']} "
                                                "hold")
        elif not seen:
            expiry_events.violations.append(f"{txn}: expired, no HoldExpired")
        elif any(e != seen[0] for e in seen) or \
                Decimal(seen[0]["amount_released"]) != hold["released"]:
            expiry_events.violations.append(f"{txn}: HoldExpired events differ or disagree "
                                            f"with the released {hold['released']}")
    expiry_events.violations += [f"{txn}: HoldExpired for no hold" for txn in expiries
                                 if txn not in db["holds"]]
    findings.append(expiry_events)

    # --- what was announced is what the database holds. A decision published (and its
    # offset committed) that the database lost, as a failover to a standby that lacked the
    # commit would, shows here: an event for a transaction without a record, or one whose
    # decision time is not the record's (the transaction was decided again later).
    announced = Finding("every event names a decision the database holds")
    for txn, seen in by_txn.items():
        row = processed.get(txn)
        if row is None:
            # an approval whose record was purged keeps its ledger entry; a purged decline
            # leaves nothing and would show here (the chaos runs purge nothing)
            if not (ledger.get(txn) and seen[0]["result"] == "APPROVED"):
                announced.violations.append(f"{txn}: {seen[0]['result']} published, "
                                            "no decision in the database")
        elif seen[0]["processed_at"] != event_time(row["processed_at"]):
            announced.violations.append(
                f"{txn}: published as decided at {seen[0]['processed_at']}, the database's "
                f"decision is of {event_time(row['processed_at'])}")
    findings.append(announced)
    findings.append(rebuilt_from_events(published, db["balances"]))
    findings.append(reversals_applied(applied, db["applied"]))

    # --- Redis: a key only for a committed row
    cache = Finding("every Redis dedup key has a committed database row")
    if redis_prefix is not None:
        client = _redis(settings)
        try:
            for bucket in client.scan_iter(match=f"{BUCKET_PREFIX}*", count=100):
                for txn, value in client.hscan_iter(bucket, match=f"{redis_prefix}*",
                                                    count=1000):
                    row = processed.get(txn)
                    if row is None:
                        cache.violations.append(f"{bucket}[{txn}] without a committed row")
                    elif row["fingerprint"] != read_fast_path_value(value)[0]:
                        cache.violations.append(f"{bucket}[{txn}] fingerprint differs from "
                                                "the row")
        except redis.RedisError as exc:
            cache.violations.append(f"Redis unreadable: {exc}")
    findings.append(cache)

    # --- money and sessions
    balances = Finding("balances = opening + ledger, none negative (payauth verify)")
    for name, finding in asyncio.run(verify(dsn)):
        if finding is not None:
            balances.violations.append(f"{name}: {finding.count}")
    findings.append(balances)
    idle = Finding("no session left idle in transaction")
    if db["idle"]:
        idle.violations.append(f"{db['idle']} session(s) idle in transaction")
    findings.append(idle)
    ends: dict[str, int] = defaultdict(int)
    for hold in db["holds"].values():
        ends[str(hold["state"]).lower()] += 1
    return Report(findings, dict(accounted), {
        "lifecycle messages decided": model.lifecycle_decided,
        "holds placed": len(db["holds"]), "holds expired": ends["expired"],
        "holds reversed": ends["reversed"], "holds cleared": ends["cleared"],
        "holds still active": ends["active"],
        "orphan reversals still waiting": model.orphans_waiting})


def expired_first(m: dict[str, Any], row: Any, holds: dict[str, Any]) -> bool:
    """An increment the log expects approved, declined HOLD_NOT_ACTIVE because the run's
    expiry ended its hold first (the one outcome the log cannot foresee; the model keeps
    the increment, which changes nothing it holds an expired hold to)."""
    hold = holds.get(m.get("original") or "")
    return m.get("type") == "INCREMENTAL" and row["result"] == "DECLINED" and \
        row["decline_reason"] == "HOLD_NOT_ACTIVE" and hold is not None and \
        hold["state"] == "EXPIRED"


def expected_txns(log: list[dict[str, Any]]) -> set[str]:
    return {m["txn"] for m in log if m["txn"] and m["expect"] in ("approved", "declined")}


def lifecycle_findings(model: Expected, db: dict[str, Any],
                       hold_expiry_hours: float | None) -> list[Finding]:
    """The accounts' balances and the holds' lives against the model (see the module's
    docstring), the expiries taken from the database."""
    holds, enders = db["holds"], db["enders"]
    expired = {txn for txn, row in holds.items() if row["state"] == "EXPIRED"}
    held = model.held(expired)
    balances = Finding("every account's balance, held and available are what the log "
                       "implies (account_balances)")
    for account, row in db["balances"].items():
        balance = row["opening_balance"] + model.balance_delta.get(account, Decimal(0))
        keeps = held.get(account, Decimal(0))
        implied = (balance, keeps, balance - keeps)
        seen = (row["balance"], row["held"], row["available"])
        if seen != implied:
            balances.violations.append(
                f"{account}: balance/held/available {'/'.join(map(str, seen))}, the log "
                f"implies {'/'.join(map(str, implied))}")

    ends = Finding("every hold is what the log implies and ends at most once (expiries "
                   "from the database)")
    for txn, hold in model.holds.items():
        row = holds.get(txn)
        if row is None:
            ends.violations.append(f"{txn}: approved {hold.amount}, no hold")
            continue
        said = sorted(enders.get(txn, []))
        if row["state"] == "EXPIRED":
            if said or row["ended_by"]:
                ends.violations.append(f"{txn}: expired, and ended by {said or row['ended_by']}"
                                       " too")
            if row["released"] not in hold.while_active:
                ends.violations.append(f"{txn}: expiry released {row['released']}, the hold "
                                       f"kept {hold.while_active or 'nothing'} while active")
            if hold_expiry_hours is not None and \
                    row["ended_at"] - row["placed_at"] < timedelta(hours=hold_expiry_hours):
                ends.violations.append(f"{txn}: expired {row['ended_at'] - row['placed_at']} "
                                       "after it was placed, before its age")
            continue
        life = (row["amount"], row["incremented"], row["remaining"], row["state"],
                row["ended_by"], said)
        lived = (hold.amount, hold.incremented, hold.remaining, hold.state, hold.ended_by,
                 [hold.ended_by] if hold.ended_by and not hold.ended_on_arrival else [])
        if life != lived:
            ends.violations.append(f"{txn}: amount/incremented/remaining/state/ended_by/"
                                   f"ended by {life}, the log implies {lived}")
    ends.violations += [f"{txn}: a hold the log never placed" for txn in holds
                        if txn not in model.holds]
    return [balances, ends]
