-- idem: recovery points of phased handlers (SQLite), beside the records table
-- `{table}`. A point outlives a released attempt, whose record is deleted.
-- Times are Unix milliseconds from SQLite's own clock.
CREATE TABLE IF NOT EXISTS {table}_points (
    operation   BLOB    NOT NULL,               -- the operation's identity (32 bytes)
    phase       TEXT    NOT NULL,               -- the phase's name
    output      BLOB    NOT NULL,               -- what the phase produced, as JSON
    expires_at  INTEGER NOT NULL,
    created_at  INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)),
    PRIMARY KEY (operation, phase)              -- decides which run finished a phase
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {table}_points_expires_at ON {table}_points (expires_at);
