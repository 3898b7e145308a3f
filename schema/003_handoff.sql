-- knod-policy session journal, schema version 3: bindings kept across a daemon restart.
-- A daemon stopped under systemd with a file-descriptor store leaves its live sessions open and
-- writes here what the next start needs to take each binding back (holder, region identity, key
-- MAC and grant, driver state, counters), as a JSON object. The key itself is never stored; its
-- MAC is only good with the key secret in the state dir. The next start reads and clears every
-- handoff at once: a session it cannot take back is closed as daemon-restart.
ALTER TABLE sessions ADD COLUMN handoff TEXT;
