-- idem: idempotency records (PostgreSQL). `{table}` is the validated table name.
CREATE TABLE IF NOT EXISTS {table} (
    key_hash    BYTEA       PRIMARY KEY,            -- blake3 of the stored key: the unique index
    idem_key    TEXT        NOT NULL,               -- the key itself, for operators
    state       CHAR(1)     NOT NULL CHECK (state IN ('I', 'C')),  -- in flight / completed
    owner       BYTEA,                              -- owner token while in flight
    fingerprint BYTEA       NOT NULL,
    outcome     BYTEA,                              -- encoded outcome once completed
    expires_at  TIMESTAMPTZ NOT NULL,               -- lease end (in flight) or retention end (completed)
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {table}_expires_at ON {table} (expires_at);
