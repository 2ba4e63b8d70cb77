"""What a batch leaves behind for the people watching: its metrics and its log lines, once per
batch, from the plan's typed outcomes (``plan.BatchPlan``). No I/O but the log stream.

One log line per batch for its decisions (partition, offset, transaction_id, outcome each:
the audit trail, searchable by id, at a fraction of the cost of a line each), one per
problem; duplicates are summed up in one warning per batch, ids included, so that a replay
of millions does not flood the logs.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import structlog

from service import metrics
from service.core.plan import BatchPlan, Conflict, Decided, Duplicate, Invalid
from service.domain.vocabulary import DuplicateCause, DuplicateLayer

log = structlog.get_logger("service.core.pipeline")


def account(plan: BatchPlan) -> None:
    outcomes: Counter[str] = Counter()
    layers: Counter[tuple[DuplicateLayer, DuplicateCause]] = Counter()
    duplicate_ids: list[str] = []
    decisions: list[dict[str, object]] = []
    debug = log.is_enabled_for(logging.DEBUG)
    for o in plan.outcomes:
        outcome = o.outcome  # a property for a decision: read once
        outcomes[outcome] += 1
        msg = o.msg
        if isinstance(o, Duplicate):  # the common case of a replay: kept cheap
            layers[(o.layer, o.cause)] += 1
            duplicate_ids.append(o.transaction_id)
            if debug:
                log.debug("duplicate", layer=o.layer, cause=o.cause, partition=msg.partition(),
                          offset=msg.offset(), transaction_id=o.transaction_id)
        elif isinstance(o, Decided):
            decisions.append({"partition": msg.partition(), "offset": msg.offset(),
                              "transaction_id": o.record.transaction_id,
                              "outcome": outcome.value})  # console logs repr members
        elif isinstance(o, Invalid):
            # No transaction id: an id is only trusted (free of card data) once validated.
            log.warning("dead_lettered", reason=o.reason.value, source=o.source,
                        partition=msg.partition(), offset=msg.offset(),
                        outcome=outcome, transaction_id=None, message_id=None)
        elif isinstance(o, Conflict):
            log.warning("idempotency_key_conflict", partition=msg.partition(),
                        offset=msg.offset(), outcome=outcome,
                        transaction_id=o.transaction_id, message_id=o.message_id)
    if decisions:
        log.info("decided", count=len(decisions), decisions=decisions)
    for name, count in outcomes.items():
        metrics.messages_total.labels(name).inc(count)
    _decisions(plan)
    by_layer: Counter[str] = Counter()
    by_cause: Counter[str] = Counter()
    for (layer, cause), count in layers.items():
        metrics.duplicates_total.labels(layer, cause).inc(count)
        by_layer[layer.value] += count  # plain keys: orjson refuses a str subclass as a key
        by_cause[cause.value] += count
    if duplicate_ids:
        log.warning(
            "duplicates", count=len(duplicate_ids), by_layer=dict(by_layer),
            by_cause=dict(by_cause),
            partition=plan.outcomes[0].msg.partition(), transaction_ids=duplicate_ids[:100],
            more=max(0, len(duplicate_ids) - 100),
        )
    reasons = Counter(o.reason.value for o in plan.dead_letters())
    for reason, count in reasons.items():
        metrics.dead_letters_total.labels(reason).inc(count)


class StageClock:
    """Observes the time since the previous lap under the stage just finished."""

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        metrics.stage_seconds.labels(stage).observe(now - self._last)
        self._last = now


def _decisions(plan: BatchPlan) -> None:
    """The decisions of the batch by kind and result, its declines by reason, its partial
    approvals: counted per batch, one increment per label."""
    kinds: Counter[tuple[str, str]] = Counter()
    reasons: Counter[str] = Counter()
    partial = 0
    for o in plan.outcomes:
        if isinstance(o, Decided):
            record = o.record
            kinds[(record.authorization_type, record.result)] += 1
            if record.decline_reason is not None:
                reasons[record.decline_reason] += 1
            partial += record.partial
    for (kind, result), count in kinds.items():
        metrics.decisions_total.labels(kind, result).inc(count)
    for reason, count in reasons.items():
        metrics.declines_total.labels(reason).inc(count)
    if partial:
        metrics.partial_approvals_total.inc(partial)
