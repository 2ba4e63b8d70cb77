-- Duplicate provenance: why duplicates come, at no per-duplicate write on the hot path.
--
-- replay_marks: `payauth replay --execute` notes, per partition, the committed offset it
-- rewound from; workers read the marks and count a duplicate below that offset as cause
-- `replay` (an operator's rewind, not a redelivery).
CREATE TABLE replay_marks (
    group_id      text NOT NULL,
    topic         text NOT NULL,
    partition     integer NOT NULL,
    before_offset bigint NOT NULL,  -- the committed offset before the rewind
    executed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);

-- duplicate_sightings: one row per batch, cause and layer, naming the transactions seen
-- again (written with the publication receipts, off the hot path; purged by age with the
-- dedup records). `payauth explain` counts a transaction's duplicates by cause from it. No
-- index on txn_ids: a GIN index made every replayed duplicate an index insertion (a
-- replay's throughput fell by a fifth), while explain, rare, scans rows that each stand for
-- a whole batch.
CREATE TABLE duplicate_sightings (
    seen_at   timestamptz NOT NULL,
    cause     text NOT NULL CHECK (cause IN ('redelivery', 'producer_retry', 'cross_partition',
                                             'replay', 'redrive')),
    layer     text NOT NULL CHECK (layer IN ('redis', 'postgres')),
    partition integer NOT NULL,
    txn_ids   text[] NOT NULL
);
CREATE INDEX duplicate_sightings_seen_at_idx ON duplicate_sightings (seen_at);

GRANT SELECT ON replay_marks TO payauth_worker;
GRANT SELECT, INSERT, DELETE ON duplicate_sightings TO payauth_worker;
