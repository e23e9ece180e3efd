-- idem: idempotency records (SQLite). `{table}` is the validated table name.
-- Times are Unix milliseconds from SQLite's own clock (julianday('now')).
CREATE TABLE IF NOT EXISTS {table} (
    key_hash    BLOB    NOT NULL PRIMARY KEY,       -- blake3 of the stored key: the unique index
    idem_key    TEXT    NOT NULL,                   -- the key itself, for operators
    state       TEXT    NOT NULL CHECK (state IN ('I', 'C')),  -- in flight / completed
    owner       BLOB,                               -- owner token while in flight
    fingerprint BLOB    NOT NULL,
    outcome     BLOB,                               -- encoded outcome once completed
    expires_at  INTEGER NOT NULL,                   -- lease end (in flight) or retention end (completed)
    created_at  INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {table}_expires_at ON {table} (expires_at);
