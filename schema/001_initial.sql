-- knod-policy session journal, schema version 1.
-- Applied by the daemon when PRAGMA user_version is below 1; see journal/.

-- One row per binding, from grant to end.
CREATE TABLE sessions (
    id              TEXT PRIMARY KEY,      -- binding id, as in /org/knod/Policy1/bindings/<id>
    uid             INTEGER NOT NULL,
    pid             INTEGER NOT NULL,
    exe             TEXT NOT NULL DEFAULT '',
    unit            TEXT NOT NULL DEFAULT '',
    netdev          TEXT NOT NULL,
    gpu             TEXT NOT NULL,
    mode            TEXT NOT NULL,
    region_bytes    INTEGER NOT NULL,
    flows           TEXT NOT NULL,         -- JSON array of canonical flow specs
    key_id          TEXT NOT NULL,         -- public id only; key bytes are never stored
    rule            TEXT NOT NULL,
    started_us      INTEGER NOT NULL,      -- microseconds since the Unix epoch
    ended_us        INTEGER,               -- NULL while the binding lives
    end_reason      TEXT,                  -- release, revoke, expire, process-exit, ...
    rx_bytes        INTEGER NOT NULL DEFAULT 0,
    rx_packets      INTEGER NOT NULL DEFAULT 0,
    dropped_packets INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX sessions_uid_started ON sessions (uid, started_us);
CREATE INDEX sessions_open ON sessions (ended_us) WHERE ended_us IS NULL;

-- Append-only log. Each row's hash covers the previous row's hash and this row's fields in a
-- canonical encoding, so an edit, deletion, insertion or reordering breaks the chain.
CREATE TABLE events (
    seq         INTEGER PRIMARY KEY,       -- 1, 2, 3, ... without gaps
    at_us       INTEGER NOT NULL,
    kind        TEXT NOT NULL,             -- request-granted, request-denied, release, ...
    session_id  TEXT,
    uid         INTEGER,
    pid         INTEGER,
    rule        TEXT,
    decision    TEXT,
    reason      TEXT,
    detail      TEXT,                      -- JSON object with anything else worth keeping
    prev_hash   BLOB NOT NULL,
    hash        BLOB NOT NULL
);
CREATE INDEX events_session ON events (session_id);
CREATE INDEX events_at ON events (at_us);

-- A speed bump, not the guarantee: the hash chain is what detects tampering.
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
