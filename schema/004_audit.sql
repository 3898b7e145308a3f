-- knod-policy session journal, schema version 4: what an audit needs besides the chain.
--
-- meta: facts about this journal file. 'journal_id' is random, made once with the file (or by
-- this migration); with an event's seq it names the event everywhere (exports, the copies of
-- the chain head the daemon sends to the system journal). 'machine_id' and 'hostname' are the
-- host of the daemon that last opened the journal for writing, so a copy gathered elsewhere
-- still says where it came from. Each daemon-start event repeats all three inside the chain.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO meta (key, value) VALUES ('journal_id', lower(hex(randomblob(16))));

-- What the chain covers (journal/table_check.h): every sessions row is checked against
-- the "session" values of its grant event and the "end" values of its closing event, each
-- policies row against its digest and the policy loads that name it, meta.journal_id against
-- the daemon-start events, each checkpoint against its retention-prune event. Only the sessions
-- handoff column (restart state under a key MAC) is outside.

-- policies: the text of every policy the daemon ran with, once per SHA-256 digest (lowercase
-- hex of the text). Decision events name the digest in force; verify checks each row's text
-- against its digest and that every digest the chain names has its row.
CREATE TABLE policies (
    digest          TEXT PRIMARY KEY,
    text            TEXT NOT NULL,
    first_loaded_us INTEGER NOT NULL
);
