-- idem: recovery points of phased handlers (MySQL / MariaDB), beside the records
-- table `{table}`. A point outlives a released attempt, whose record is deleted.
CREATE TABLE IF NOT EXISTS {table}_points (
    operation   BINARY(32)     NOT NULL,        -- the operation's identity
    phase       VARBINARY(255) NOT NULL,        -- the phase's name, compared byte for byte
    output      LONGBLOB       NOT NULL,        -- what the phase produced, as JSON
    expires_at  DATETIME(6)    NOT NULL,
    created_at  DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (operation, phase),             -- decides which run finished a phase
    INDEX {table}_points_expires_at (expires_at)
) ENGINE = InnoDB;
