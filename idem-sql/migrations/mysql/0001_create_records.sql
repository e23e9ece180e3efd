-- idem: idempotency records (MySQL / MariaDB). `{table}` is the validated table name.
-- Times are UTC_TIMESTAMP(6), the server's clock, whatever the session time zone.
CREATE TABLE IF NOT EXISTS {table} (
    key_hash    BINARY(32)  NOT NULL PRIMARY KEY,   -- blake3 of the stored key: the unique index
    idem_key    TEXT        NOT NULL,               -- the key itself, for operators
    state       CHAR(1)     NOT NULL,               -- 'I' in flight / 'C' completed
    owner       BINARY(16)  NULL,                   -- owner token while in flight
    fingerprint BINARY(32)  NOT NULL,
    outcome     LONGBLOB    NULL,                   -- encoded outcome once completed
    expires_at  DATETIME(6) NOT NULL,               -- lease end (in flight) or retention end (completed)
    created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    INDEX {table}_expires_at (expires_at)
) ENGINE = InnoDB;
