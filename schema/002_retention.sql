-- knod-policy session journal, schema version 2: retention.
-- Pruning deletes the oldest events; a checkpoint keeps the hash of the last pruned event, so
-- the chain still verifies from the first event that remains. Each prune is itself an event in
-- the chain ("retention-prune"), naming the checkpoint it made.
CREATE TABLE checkpoints (
    seq          INTEGER PRIMARY KEY,  -- the last pruned event
    hash         BLOB NOT NULL,        -- its hash: the prev_hash of the first remaining event
    pruned_at_us INTEGER NOT NULL,
    events       INTEGER NOT NULL      -- how many events this prune removed
);
