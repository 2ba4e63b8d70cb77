"""Every Prometheus metric of the service, defined once, with bounded labels.

Names are part of the external contract (docs/operations.md, "Watch"; the dashboards and
alerts query them): extend, never rename.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.domain.errors import DeadLetterReason
from service.domain.vocabulary import (
    CardStatus,
    DeclineReason,
    DuplicateCause,
    DuplicateLayer,
)

REGISTRY = CollectorRegistry(auto_describe=True)

OUTCOMES = ("approved", "declined", "duplicate", "conflict", "invalid")

messages_total = Counter(
    "payauth_messages_total",
    "Messages consumed from the input topic, by what happened to them.",
    ["outcome"],
    registry=REGISTRY,
)
duplicates_total = Counter(
    "payauth_duplicates_total",
    "Duplicates caught, by the layer that caught them and why they came.",
    ["layer", "cause"],
    registry=REGISTRY,
)
processing_seconds = Histogram(
    "payauth_processing_seconds",
    "Time to process one batch (one or more partitions), from hand-off to offsets reported.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
dedup_lookup_seconds = Histogram(
    "payauth_dedup_lookup_seconds",
    "Time of one batched dedup lookup, by store.",
    ["store"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
    registry=REGISTRY,
)
STAGES = ("parse", "redis", "validate", "postgres_lookup", "postgres_commit", "publish")
stage_seconds = Histogram(
    "payauth_batch_stage_seconds",
    "Time of each step of a batch (where a batch's time goes), by stage.",
    ["stage"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=REGISTRY,
)
batch_messages = Histogram(
    "payauth_batch_messages",
    "Messages per batch (small under light load, growing with the backlog).",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500),
    registry=REGISTRY,
)
decisions_total = Counter(
    "payauth_decisions_total",
    "Decisions made (not duplicates), by the message's kind and result (an issuer's day: "
    "verifications, balance inquiries, increments beside purchases and the lifecycle).",
    ["kind", "result"],
    registry=REGISTRY,
)
declines_total = Counter(
    "payauth_declines_total",
    "Declines, by reason (one per decline, the first that applies).",
    ["reason"],
    registry=REGISTRY,
)
partial_approvals_total = Counter(
    "payauth_partial_approvals_total",
    "Purchases and authorizations approved for less than asked (the available balance).",
    registry=REGISTRY,
)
dead_letters_total = Counter(
    "payauth_dead_letters_total",
    "Messages written to the dead-letter topic, by reason.",
    ["reason"],
    registry=REGISTRY,
)
consumer_lag = Gauge(
    "payauth_consumer_lag",
    "Messages behind the partition's high watermark, per assigned partition.",
    ["partition"],
    registry=REGISTRY,
)
dedup_records = Gauge(
    "payauth_dedup_records",
    "Rows in the PostgreSQL dedup store (processed_transactions), as PostgreSQL's statistics "
    "estimate them (counting billions of rows would scan them all).",
    registry=REGISTRY,
)
dedup_store_bytes = Gauge(
    "payauth_dedup_store_bytes",
    "Bytes the PostgreSQL dedup store takes on disk: processed_transactions (every "
    "partition), its indexes and TOAST.",
    registry=REGISTRY,
)
dedup_oldest_age_seconds = Gauge(
    "payauth_dedup_oldest_age_seconds",
    "Age of the oldest PostgreSQL dedup record: above the retention, the purge is not "
    "keeping up and the store grows past what the retention allows.",
    registry=REGISTRY,
)
dedup_retention_seconds = Gauge(
    "payauth_dedup_retention_seconds",
    "PAYAUTH_DEDUP_RETENTION_HOURS, in seconds (what the alert compares the oldest with).",
    registry=REGISTRY,
)
# The lifecycle (docs/lifecycle.md), read from the database now and then by each worker (all
# replicas report the same values: aggregate with max, not sum).
holds_active = Gauge(
    "payauth_holds_active",
    "Active holds, by currency.",
    ["currency"],
    registry=REGISTRY,
)
holds_active_amount = Gauge(
    "payauth_holds_active_amount",
    "What active holds keep, by currency (in the currency's units).",
    ["currency"],
    registry=REGISTRY,
)
holds_overdue = Gauge(
    "payauth_holds_overdue",
    "Active holds older than PAYAUTH_HOLD_EXPIRY_HOURS: `payauth holds expire` is not "
    "running (or failing).",
    registry=REGISTRY,
)
holds_expired = Gauge(
    "payauth_holds_expired",
    "Holds ended by expiry so far (its increase is the expiries of a period).",
    registry=REGISTRY,
)
holds_expiry_unpublished = Gauge(
    "payauth_holds_expiry_unpublished",
    "Expired holds whose HoldExpired event is not confirmed published yet (the next "
    "`payauth holds expire` run publishes them).",
    registry=REGISTRY,
)
orphan_reversals_waiting = Gauge(
    "payauth_orphan_reversals_waiting",
    "Reversals kept until their original arrives.",
    registry=REGISTRY,
)
cards_not_active = Gauge(
    "payauth_cards_not_active",
    "Cards whose status declines them (FROZEN, LOST, STOLEN, CLOSED), by status.",
    ["status"],
    registry=REGISTRY,
)
limit_usage_ratio = Gauge(
    "payauth_limit_usage_ratio",
    "The ten spending limits nearest their ceiling in the period under way: usage over the "
    "maximum (amount or count, the nearer), by limit_id; the set is replaced at each read.",
    ["limit_id"],
    registry=REGISTRY,
)
redis_up = Gauge(
    "payauth_redis_up",
    "1 when the Redis fast path answers, 0 while the worker runs on PostgreSQL alone.",
    registry=REGISTRY,
)
events_published_total = Counter(
    "payauth_events_published_total",
    "Result events acknowledged by Kafka; republished repeats of a stored result included.",
    ["kind"],  # first, republish
    registry=REGISTRY,
)
retries_total = Counter(
    "payauth_retries_total",
    "Batches retried after a transient failure, by cause.",
    # store_unavailable, claim_lost (a batch's claims another replica won, looked up again;
    # the rest decided), statement_timeout, transient, publish_failed, unexpected, isolate
    ["cause"],
    registry=REGISTRY,
)
oldest_unfinished_seconds = Gauge(
    "payauth_oldest_unfinished_seconds",
    "Age of the oldest message taken from the partition and not yet finished (0 when none):"
    " a partition that cannot make progress shows here.",
    ["partition"],
    registry=REGISTRY,
)
assigned_partitions = Gauge(
    "payauth_assigned_partitions",
    "Input partitions currently assigned to this worker.",
    registry=REGISTRY,
)

for _outcome in OUTCOMES:
    messages_total.labels(_outcome)
for _layer in DuplicateLayer:
    for _cause in DuplicateCause:
        duplicates_total.labels(_layer.value, _cause.value)
for _stage in STAGES:
    stage_seconds.labels(_stage)
for _store in ("redis", "postgres"):
    dedup_lookup_seconds.labels(_store)
# Every series exists from the start at 0, so rate() and alerts see the first increment.
for _reason in DeadLetterReason:
    dead_letters_total.labels(_reason.value)
for _decline in DeclineReason:
    declines_total.labels(_decline.value)
for _status in CardStatus:
    if _status is not CardStatus.ACTIVE:
        cards_not_active.labels(_status.value)
