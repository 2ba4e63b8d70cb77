-- Publication receipts: one row per batch whose events Kafka acknowledged, instead of an
-- UPDATE of published_at on every dedup record. Each dedup record names the batch that
-- decided it (batch_id); it counts as published when its published_at is set (records of
-- earlier versions, and the rare republication of a record never confirmed) or when its
-- batch has a receipt. The UPDATE wrote a second version of every row (its heap tuple and
-- both index entries again), a quarter of PostgreSQL's time per authorization, and left as
-- many dead tuples for autovacuum; a receipt is one small row per batch.
CREATE TABLE published_batches (
    batch_id     uuid PRIMARY KEY,
    published_at timestamptz NOT NULL
);
CREATE INDEX published_batches_published_at_idx ON published_batches (published_at);

ALTER TABLE processed_transactions ADD COLUMN batch_id uuid;

-- Receipts are purged with the dedup records, by age (published_at >= processed_at, so a
-- receipt outlives the records that rely on it).
GRANT SELECT, INSERT, DELETE ON published_batches TO payauth_worker;

-- Every batch moves balances: leave room on each page for the row's next version, so that
-- the update is HOT (same page, no index entry written; balance is not indexed).
ALTER TABLE accounts SET (fillfactor = 80);
