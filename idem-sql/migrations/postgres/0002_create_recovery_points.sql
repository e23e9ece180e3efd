-- idem: recovery points of phased handlers (PostgreSQL), beside the records table
-- `{table}`. A point outlives a released attempt, whose record is deleted.
CREATE TABLE IF NOT EXISTS {table}_points (
    operation   BYTEA       NOT NULL,           -- the operation's identity (32 bytes)
    phase       TEXT        NOT NULL,           -- the phase's name
    output      BYTEA       NOT NULL,           -- what the phase produced, as JSON
    expires_at  TIMESTAMPTZ NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (operation, phase)              -- decides which run finished a phase
);
CREATE INDEX IF NOT EXISTS {table}_points_expires_at ON {table}_points (expires_at);
