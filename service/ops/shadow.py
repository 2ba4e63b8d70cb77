"""``payauth replay --shadow``: what the decision rule as it is now would change, before any
replay, moving no money and writing nothing.

A replay re-reads messages, but a decided transaction is a duplicate and keeps its stored
result. So after a fix to the rule, the question is which stored decisions the rule now
decides otherwise. Each decision keeps the inputs it read (the account's balance, status
and currency, the card's status and expiry, the blocks that matched, each spending limit
with the usage it read, and the rule's version: ``sql/payauth_decide.sql``); the shadow
replay calls ``payauth_card_verdict`` and ``payauth_decide`` as the database has them now on
those inputs and compares, today's card statuses and usage unread. (The message's date, which
a card's expiry is judged against, is read in PAYAUTH_LIMITS_TIMEZONE as set now.)

Each transaction is decided again alone, on its own stored inputs: when an earlier decision
on the same account changes (a refund now approved), the balances later decisions read are
not recomputed, so a change that follows from another one is not shown.

The lifecycle kinds are decided again too, by the same rule on the same stored inputs (the
balance read is the available one): whether an AUTHORIZATION, ADVICE or CLEARING is
approved or declined. What a REVERSAL released or a CLEARING released from its hold is not
decided again: it follows from the hold's state at the time, which no input row keeps
(``payauth explain`` shows it).

A message with no dedup record is one of these, in this order, and only the last is a
change: a message a replay would dead-letter again (invalid; a conflict; a REVERSAL,
CLEARING or ADVICE that names what it cannot, ``payauth_mismatch`` as the worker asks it);
a decision whose dedup record was purged, its effect read where it is kept (the ledger, the
lifecycle records, or, for a decline, which leaves no effect, its event on the output
topic); a message never decided, which a replay would decide (against its account as it is
now; the card controls are not judged for it here).

The range: what ``payauth replay`` would re-read (``--to-datetime``, ``--to-earliest``,
``--shift-by``: from the target to the group's committed offset), explicit offsets
(``--from-offset``/``--to-offset``, inclusive), or a list of transaction ids. Safe while the
workers run: the topic is read by an assigned consumer that joins no group and commits
nothing, the database in read-only transactions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import asyncpg
import orjson
from confluent_kafka import Consumer, KafkaError, TopicPartition

from service.adapters.kafka.config import client_config
from service.config import Settings
from service.core.plan import Limits, decode_all
from service.domain.messages import Authorization
from service.ops.replay import PartitionPlan, ReplayRefused, partitions_of
from service.ops.shadow_report import Decision, ShadowReport

_CHUNK = 2_000  # messages classified per database round trip
# The events of a decision of a message of its own (not an expiry, not an orphan applied).
_DECISION_EVENTS = frozenset({"PaymentAuthorized", "PaymentDeclined", "PaymentReversed",
                              "PaymentCleared"})
_QUIET_SECONDS = 30  # no message for this long before the range's end: the read fails

RULE_VERSION = "SELECT payauth_rule_version()"  # defined once, sql/payauth_rule_version.sql
# The stored decision and what the rule decides now from the same inputs.
_DECIDE_AGAIN = """
SELECT d.*,
       CASE WHEN d.now = 'PARTIAL' THEN payauth_approved(d.now, d.amt, d.input_balance)::text
       END AS now_partial
  FROM (SELECT p.txn_id, p.fingerprint, p.result, p.decline_reason, p.rule_version,
               p.input_balance, p.authorization_type,
               CASE WHEN p.amount_approved < payauth_account_amount(
                             p.input_currency::text, p.currency::text, p.amount,
                             p.billing_currency::text, p.billing_amount)
                    THEN p.amount_approved::text END AS partial,
               payauth_account_amount(p.input_currency::text, p.currency::text, p.amount,
                                      p.billing_currency::text, p.billing_amount) AS amt,
               CASE WHEN p.rule_version IS NOT NULL
                    THEN payauth_decide(
                             p.input_balance, p.input_status, p.authorization_type,
                             payauth_account_amount(p.input_currency::text, p.currency::text,
                                                    p.amount, p.billing_currency::text,
                                                    p.billing_amount),
                             p.input_hold_state, coalesce(p.partial_ok, false),
                             payauth_card_verdict(p.card_id, p.input_card_status,
                                                  p.input_card_expires,
                                                  (p.message_time AT TIME ZONE $2)::date,
                                                  p.input_blocks),
                             r.room, r.count_room)
               END AS now
          FROM processed_transactions p
          -- The room the limits left, as the decision read them.
          LEFT JOIN LATERAL (
               SELECT min((l->>'max_amount')::numeric - (l->>'used_amount')::numeric)
                          AS room,
                      min((l->>'max_count')::integer - (l->>'used_count')::integer)
                          AS count_room
                 FROM jsonb_array_elements(payauth_input_limits(p.input_limit_reads,
                                                                p.input_limits)) AS l) r ON true
         WHERE p.txn_id = ANY($1::text[])) d
"""
# Decided, the dedup record purged: the effect is kept in the ledger (an approved purchase,
# refund or clearing) or in the lifecycle records (every lifecycle message, never purged).
_EFFECT_KEPT = """
SELECT txn_id FROM ledger_entries WHERE txn_id = ANY($1::text[])
UNION
SELECT txn_id FROM lifecycle_messages WHERE txn_id = ANY($1::text[])
"""
# No record: a replay would dead-letter it (mismatch) or decide it, each alone against its
# account as it is now.
_DECIDE_NOW = """
SELECT d.mismatch, d.now,
       CASE WHEN d.now = 'PARTIAL' THEN payauth_approved(d.now, d.amt, d.balance)::text
       END AS now_partial
  FROM (SELECT payauth_mismatch(t.auth_type, t.account_id, t.currency, t.amount, t.bcur,
                                t.bamt, t.original) AS mismatch,
               a.balance - a.held AS balance,
               payauth_account_amount(a.currency::text, t.currency, t.amount, t.bcur,
                                      t.bamt) AS amt,
               payauth_decide(a.balance - a.held, a.status, t.auth_type,
                              payauth_account_amount(a.currency::text, t.currency, t.amount,
                                                     t.bcur, t.bamt),
                              (SELECT h.state FROM holds h WHERE h.txn_id = t.original
                                  AND h.account_id = t.account_id
                                  AND t.auth_type = 'INCREMENTAL'),
                              t.partial_ok, NULL, NULL, NULL) AS now, t.ord
          FROM unnest($1::text[], $2::numeric[], $3::text[], $4::text[], $5::text[],
                      $6::numeric[], $7::text[], $8::boolean[]) WITH ORDINALITY
               AS t(account_id, amount, currency, auth_type, original, bamt, bcur, partial_ok,
                    ord)
          LEFT JOIN accounts a ON a.account_id = t.account_id) d
 ORDER BY d.ord
"""


@dataclass(frozen=True)
class OffsetRange:
    partition: int
    start: int
    end: int  # exclusive

    def __str__(self) -> str:
        return f"{self.partition}: {self.start}-{self.end - 1}" if self.end > self.start \
            else f"{self.partition}: none"


def ranges_of_plans(plans: Sequence[PartitionPlan]) -> list[OffsetRange]:
    """What the replay plan would re-read: from its target to the committed offset."""
    return [OffsetRange(p.partition, p.target, max(p.target, p.current or p.target))
            for p in plans]


def ranges_of_offsets(settings: Settings, from_offset: int | None, to_offset: int | None,
                      partitions: list[int] | None) -> list[OffsetRange]:
    """Explicit offsets (``to_offset`` inclusive), within what each partition holds."""
    consumer = Consumer({**client_config(settings), "group.id": f"{settings.group_id}.shadow",
                         "enable.auto.commit": False})
    try:
        topic = settings.input_topic
        out = []
        for p in partitions_of(consumer, topic, partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            start = max(low, from_offset if from_offset is not None else low)
            end = min(high, to_offset + 1 if to_offset is not None else high)
            out.append(OffsetRange(p, start, max(start, end)))
        return out
    finally:
        consumer.close()


def read_range(settings: Settings, ranges: Sequence[OffsetRange]) -> Iterator[list[Any]]:
    """The messages of the ranges, in chunks; joins no group, commits nothing."""
    todo = {r.partition: r for r in ranges if r.end > r.start}
    if not todo:
        return
    # "error": a start offset that retention deleted since the plan is refused, never
    # silently replaced by the end of the partition.
    consumer = Consumer({**client_config(settings), "group.id": f"{settings.group_id}.shadow",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition(settings.input_topic, r.partition, r.start)
                         for r in todo.values()])
        chunk: list[Any] = []
        quiet = 0.0
        while todo:
            msgs = consumer.consume(500, timeout=1.0)
            # Only progress on a partition still to read counts as progress.
            quiet = 0.0 if any(m.partition() in todo for m in msgs) else quiet + 1.0
            if quiet >= _QUIET_SECONDS:
                raise ReplayRefused(
                    f"no message for {_QUIET_SECONDS} s before the end of partition(s) "
                    f"{sorted(todo)} of {settings.input_topic}; is the broker reachable?")
            for msg in msgs:
                partition, offset, error = msg.partition(), msg.offset(), msg.error()
                r = todo.get(partition) if partition is not None else None
                if r is None:
                    continue
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        del todo[r.partition]  # the range ended early (records compacted)
                        continue
                    raise ReplayRefused(f"reading partition {r.partition} of "
                                        f"{settings.input_topic} from offset {r.start}: "
                                        f"{error.str()} (deleted by retention?)")
                if offset is None:
                    continue
                if offset < r.end:
                    chunk.append(msg)
                if offset >= r.end - 1:
                    del todo[r.partition]
            if len(chunk) >= _CHUNK:
                yield chunk
                chunk = []
        if chunk:
            yield chunk
    finally:
        consumer.close()


def published_decisions(settings: Settings, transaction_ids: set[str]) -> set[str]:
    """Which of these transactions have a decision's event on the output topic: decided,
    their dedup record purged since (a decline leaves nothing else behind). Reads the
    output topic from its start; joins no group, commits nothing."""
    consumer = Consumer({**client_config(settings), "group.id": f"{settings.group_id}.shadow",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    found: set[str] = set()
    try:
        topic = settings.output_topic
        partitions = partitions_of(consumer, topic, None)
        todo = set()
        assignment = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                todo.add(p)
                assignment.append(TopicPartition(topic, p, low))
        consumer.assign(assignment)
        quiet = 0.0
        while todo:
            msgs = consumer.consume(500, timeout=1.0)
            quiet = 0.0 if msgs else quiet + 1.0
            if quiet >= _QUIET_SECONDS:
                raise ReplayRefused(f"no message for {_QUIET_SECONDS} s before the end of "
                                    f"{topic}; is the broker reachable?")
            for msg in msgs:
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        todo.discard(msg.partition())
                        continue
                    raise ReplayRefused(f"reading {topic}: {error.str()}")
                try:
                    event = orjson.loads(msg.value() or b"")
                except orjson.JSONDecodeError:
                    continue
                txn = event.get("transaction_id") if isinstance(event, dict) else None
                if txn in transaction_ids and event.get("event_type") in _DECISION_EVENTS:
                    found.add(txn)
        return found
    finally:
        consumer.close()


async def rule_version_now(conn: asyncpg.Connection) -> str:
    version = await conn.fetchval(RULE_VERSION)
    if version is None:
        raise ReplayRefused("the database has no payauth_decide: run payauth migrate")
    return str(version)


async def classify_messages(conn: asyncpg.Connection, report: ShadowReport,
                            msgs: Sequence[Any], settings: Settings) -> None:
    """Put each message's transaction in its group of the report."""
    # The worker's own decoding step, so a message is refused here exactly as it would be.
    decoded, invalid = decode_all(msgs, Limits(max_message_bytes=settings.max_message_bytes,
                                               max_refund=settings.max_refund_amount))
    valid = [auth for _, auth in decoded]
    for dead in invalid:
        report.dead_lettered_again[dead.reason.value] += 1
    report.messages += len(msgs)
    ids = list({a.transaction_id for a in valid})
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        stored = {r["txn_id"]: r for r in await conn.fetch(_DECIDE_AGAIN, ids,
                                                            settings.limits_timezone)}
        missing = [i for i in ids if i not in stored]
        in_ledger = {r["txn_id"] for r in await conn.fetch(_EFFECT_KEPT, missing)}
        undecided: dict[str, Authorization] = {}
        for auth in valid:
            key = auth.transaction_id
            row = stored.get(key)
            first = report.undecided_fingerprints.get(key)
            if (row is not None and row["fingerprint"] != auth.fingerprint) or \
                    (first is not None and first != auth.fingerprint):
                report.dead_lettered_again["IDEMPOTENCY_KEY_CONFLICT"] += 1
            elif not report.first_time(key):
                continue  # the same transaction again: a duplicate, compared once
            elif row is not None:
                _compare(report, key, row)
            elif key in in_ledger:
                report.ledger_only.append(key)
            else:
                undecided[key] = auth
                report.undecided_fingerprints[key] = auth.fingerprint
        if undecided:
            auths = list(undecided.values())
            outcomes = await conn.fetch(
                _DECIDE_NOW, [a.account_id for a in auths],
                [Decimal(a.amount_text) for a in auths], [a.currency for a in auths],
                [a.authorization_type.value for a in auths],
                [a.original_transaction_id for a in auths],
                [None if a.billing_amount_text is None else Decimal(a.billing_amount_text)
                 for a in auths],
                [a.billing_currency for a in auths], [a.partial_ok for a in auths])
            for auth, row in zip(auths, outcomes, strict=True):
                if row["mismatch"] is not None:
                    report.dead_lettered_again["LIFECYCLE_MISMATCH"] += 1
                else:
                    report.pending[auth.transaction_id] = Decision.of(
                        row["now"], _amount(row["now_partial"]))


def _compare(report: ShadowReport, transaction_id: str, row: Any) -> None:
    """A stored decision (a ``_DECIDE_AGAIN`` row) against the rule's answer now."""
    if row["rule_version"] is not None and row["now"] is None:
        report.no_answer.append(transaction_id)  # the rule now gives none: it is broken
        return
    report.add_decided(transaction_id,
                       Decision(row["result"], row["decline_reason"], _amount(row["partial"])),
                       Decision.of(row["now"], _amount(row["now_partial"])) if row["now"]
                       else None, row["rule_version"])


def _amount(text: str | None) -> str | None:
    """A partial approval's amount, the same text whatever scale the database gave it."""
    return None if text is None else format(Decimal(text).normalize(), "f")


async def classify_transactions(conn: asyncpg.Connection, report: ShadowReport,
                                transaction_ids: Sequence[str], limits_timezone: str = "UTC"
                                ) -> None:
    """The list-of-ids mode: no topic read; an id never decided is listed as unknown."""
    ids = list(dict.fromkeys(transaction_ids))
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        stored = {r["txn_id"]: r for r in await conn.fetch(_DECIDE_AGAIN, ids,
                                                            limits_timezone)}
        in_ledger = {r["txn_id"] for r in await conn.fetch(
            _EFFECT_KEPT, [i for i in ids if i not in stored])}
    for key in ids:
        report.first_time(key)
        row = stored.get(key)
        if row is not None:
            _compare(report, key, row)
        elif key in in_ledger:
            report.ledger_only.append(key)
        else:
            report.unknown.append(key)


async def shadow(settings: Settings, *, ranges: Sequence[OffsetRange] | None = None,
                 transaction_ids: Sequence[str] | None = None) -> ShadowReport:
    conn = await asyncpg.connect(settings.database_url.get_secret_value(), timeout=10)
    try:
        rule = await rule_version_now(conn)
        if transaction_ids is not None:
            report = ShadowReport(f"{len(transaction_ids)} transaction id(s)", rule)
            await classify_transactions(conn, report, transaction_ids,
                                        settings.limits_timezone)
            return report
        assert ranges is not None
        report = ShadowReport(f"{settings.input_topic}, partition: offsets " + (", ".join(
            str(r) for r in ranges if r.end > r.start) or "none"), rule)
        for chunk in read_range(settings, ranges):
            await classify_messages(conn, report, chunk, settings)
        if report.pending:
            decided_before = published_decisions(settings, set(report.pending))
            report.settle_pending(decided_before)
        return report
    finally:
        await conn.close()
