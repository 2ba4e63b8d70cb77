"""``payauth holds expire``: end, as EXPIRED, every active hold older than
``PAYAUTH_HOLD_EXPIRY_HOURS`` by the database's clock, and publish each one's ``HoldExpired``.

Dry run by default: lists what would end, changes nothing. ``--execute``, in this order:

1. ``payauth_expire_holds`` (``sql/payauth_expire_holds.sql``), one transaction per chunk:
   lock the holds' accounts in the order every writer uses, end each hold still ACTIVE (a
   hold a clearing or another run ended meanwhile is skipped), release what it kept. The
   age is ``now()`` of that transaction against the hold's ``placed_at``, both the
   database's clock: a host whose clock runs ahead ends nothing early.
2. Publish a ``HoldExpired`` for every expired hold whose ``expiry_published_at`` is still
   NULL (the outbox: the ones this run ended, and any a run before it ended but could not
   publish), and wait for Kafka's acknowledgements.
3. Set ``expiry_published_at`` for those, their accounts locked first as in step 1.

Two runs at once: step 1 ends each hold once (the row lock and the conditional UPDATE);
both may publish the same hold's event in step 2, with the same ``event_id`` (stable per
hold), which is what a consumer deduplicates on: once in effect. A crash between 1 and 3
leaves the events to the next run. Both runs exit 0.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import asyncpg
from confluent_kafka import Producer

from service.adapters.kafka.config import producer_config
from service.config import Settings
from service.domain.events import encode_event, hold_expired_event
from service.domain.money import format_amount

_CHUNK = 1_000  # holds' accounts locked per transaction

_WOULD_EXPIRE = """
SELECT h.txn_id, h.account_id, h.currency::text AS currency, h.remaining::text AS released,
       h.placed_at
  FROM holds h
 WHERE h.state = 'ACTIVE' AND h.placed_at <= now() - $1::numeric * interval '1 hour'
 ORDER BY h.placed_at
"""
_EXPIRE = "SELECT txn_id, account_id, currency, released, ended_at " \
          "FROM payauth_expire_holds($1::numeric, $2)"
_UNPUBLISHED = """
SELECT h.txn_id, h.account_id, h.currency::text AS currency, h.released::text AS released,
       h.ended_at, m.correlation_id
  FROM holds h
  LEFT JOIN lifecycle_messages m ON m.txn_id = h.txn_id
 WHERE h.state = 'EXPIRED' AND h.expiry_published_at IS NULL
 ORDER BY h.ended_at
 LIMIT $1
"""
# The holds' accounts are locked first, in the order every writer uses: a batch locks its
# accounts, then the holds its messages name. An UPDATE of the holds alone, in whatever
# order it met them, could keep one hold a batch waits for while waiting for another that
# batch keeps (a deadlock, and the run exits 1).
_LOCK_ACCOUNTS = """SELECT 1 FROM accounts
 WHERE account_id IN (SELECT account_id FROM holds WHERE txn_id = ANY($1::text[]))
 ORDER BY account_id FOR UPDATE"""
_MARK = """UPDATE holds SET expiry_published_at = now()
 WHERE txn_id = ANY($1::text[]) AND expiry_published_at IS NULL"""


class NotPublished(RuntimeError):
    """Kafka did not acknowledge every HoldExpired: they stay in the outbox."""


@dataclass(frozen=True)
class ExpiryReport:
    execute: bool
    hours: float
    holds: list[tuple[str, str, str, str]]  # (txn_id, account_id, amount released, currency)
    published: int = 0

    def render(self) -> str:
        verb = "expired" if self.execute else "would expire"
        lines = [f"holds expire: {len(self.holds)} hold(s) {verb} (older than "
                 f"{self.hours:g} h by the database's clock)"]
        lines += [f"  {txn}  account {account}  releases {amount} {currency}"
                  for txn, account, amount, currency in self.holds[:50]]
        if len(self.holds) > 50:
            lines.append(f"  ... and {len(self.holds) - 50} more")
        if self.execute:
            lines.append(f"holds expire: {self.published} HoldExpired event(s) published")
        else:
            lines.append("holds expire: dry run; --execute ends them")
        return "\n".join(lines)


def command(settings: Settings, *, execute: bool) -> int:
    """The command's output and exit status (Kafka not acknowledging: one line, exit 1; the
    holds ended and their events wait in the outbox for the next run)."""
    try:
        report = asyncio.run(expire(settings, execute=execute))
    except NotPublished as exc:
        print(f"payauth holds expire: {exc}", file=sys.stderr)
        return 1
    print(report.render())
    return 0


def _amount(text: str, currency: str) -> str:
    return format_amount(Decimal(text), currency)


async def expire(settings: Settings, *, execute: bool) -> ExpiryReport:
    hours = settings.hold_expiry_hours
    conn = await asyncpg.connect(settings.database_url.get_secret_value())
    try:
        if not execute:
            rows = await conn.fetch(_WOULD_EXPIRE, str(hours))
            return ExpiryReport(False, hours, [
                (r["txn_id"], r["account_id"], _amount(r["released"], r["currency"]),
                 r["currency"]) for r in rows])
        ended: list[tuple[str, str, str, str]] = []
        while True:
            rows = await conn.fetch(_EXPIRE, str(hours), _CHUNK)
            ended += [(r["txn_id"], r["account_id"], _amount(r["released"], r["currency"]),
                       r["currency"]) for r in rows]
            if not rows:
                break
        published = 0
        while True:
            outbox = await conn.fetch(_UNPUBLISHED, _CHUNK)
            if not outbox:
                break
            _publish(settings, [(r["txn_id"], r["account_id"], r["currency"],
                                 _amount(r["released"], r["currency"]), r["correlation_id"],
                                 r["ended_at"]) for r in outbox])
            await mark_published(conn, [r["txn_id"] for r in outbox])
            published += len(outbox)
        return ExpiryReport(True, hours, ended, published)
    finally:
        await conn.close()


async def mark_published(conn: asyncpg.Connection, txn_ids: list[str]) -> None:
    """Step 3: the holds' HoldExpired acknowledged, in one transaction."""
    async with conn.transaction():
        await conn.execute(_LOCK_ACCOUNTS, txn_ids)
        await conn.execute(_MARK, txn_ids)


def _publish(settings: Settings,
             holds: list[tuple[str, str, str, str, str | None, datetime]]) -> None:
    """Every event acknowledged, or raises (nothing marked: the next run publishes again)."""
    producer = Producer(producer_config(settings))
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for txn, account, currency, released, correlation, ended_at in holds:
        value = encode_event(hold_expired_event(txn, account, currency, released, correlation,
                                                ended_at))
        while True:
            try:
                producer.produce(settings.output_topic, key=account, value=value,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush(60)
    if remaining or failures:
        raise NotPublished(f"HoldExpired events not all acknowledged: {remaining} unsent, "
                           f"failures {failures[:3]}; the next run publishes them again")
