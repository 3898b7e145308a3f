#!/usr/bin/env python3
"""Forges a knod journal from a real one, as whoever holds the node's root would (#31's red team).

  forge_journal.py wipe SRC DST "SEQ:HASH,..."   every event and session deleted; a checkpoint at
      each SEQ with the HASH the system journal recorded (heads are public), the last one
      "pruned" by an invented retention-prune dated in 2199 and followed by an invented refusal;
      the anchor rewritten to the new head.
  forge_journal.py newid SRC DST CUT   the events through CUT rechained under a new journal id
      (the tail and its sessions gone), the anchor rewritten.

The chain's hash (journal/records.cc): SHA-256 of the previous hash and the event's fields, each
as 0 (NULL) or 1, a big-endian 64-bit length and the bytes, after "knod-journal-event-v1".
"""
import hashlib
import json
import os
import shutil
import sqlite3
import struct
import sys


def field(v):
    if v is None:
        return b"\0"
    b = v.encode() if isinstance(v, str) else v
    return b"\1" + struct.pack(">Q", len(b)) + b


def chained(prev, seq, at, kind, sess, uid, pid, rule, dec, reason, detail):
    text = lambda x: None if x is None else str(x)
    body = (b"knod-journal-event-v1" + field(str(seq)) + field(str(at)) + field(kind) + field(sess)
            + field(text(uid)) + field(text(pid)) + field(rule) + field(dec) + field(reason)
            + field(detail))
    return hashlib.sha256(prev + body).digest()


def add(db, prev, seq, at, kind, sess=None, uid=None, pid=None, rule=None, dec=None, reason=None,
        detail=None):
    h = chained(prev, seq, at, kind, sess, uid, pid, rule, dec, reason, detail)
    db.execute("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
               (seq, at, kind, sess, uid, pid, rule, dec, reason, detail, prev, h))
    return h


def write_anchor(dst, seq, h):
    with open(dst + ".anchor", "w") as f:
        f.write(json.dumps({"seq": seq, "hash": h.hex()}))


def main():
    cmd, src, dst = sys.argv[1:4]
    shutil.copy(src, dst)
    db = sqlite3.connect(dst)
    for t in ("events_no_update", "events_no_delete"):
        db.execute("DROP TRIGGER IF EXISTS " + t)
    jid = db.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()[0]
    at = db.execute("SELECT max(at_us) FROM events").fetchone()[0]
    if cmd == "wipe":
        recs = [(int(s), bytes.fromhex(h)) for s, h in (x.split(":") for x in sys.argv[4].split(","))]
        for table in ("events", "sessions", "checkpoints", "policies"):
            db.execute("DELETE FROM " + table)
        pruned_at, prev_seq = 7258118000000000, 0
        for s, h in recs:
            db.execute("INSERT INTO checkpoints VALUES (?,?,?,?)", (s, h, pruned_at, s - prev_seq))
            prev_seq = s
        top, top_hash = recs[-1]
        events = top - (recs[-2][0] if len(recs) > 1 else 0)
        detail = json.dumps({"events": events, "hash": top_hash.hex(), "journal_id": jid,
                             "pruned_at_us": pruned_at, "pruned_through": top,
                             "retention": {"age_us": 1, "events": None}, "through_at_us": 0},
                            separators=(",", ":"))
        prev = add(db, top_hash, top + 1, at + 1, "retention-prune", detail=detail)
        prev = add(db, prev, top + 2, at + 2, "request-denied", uid=4242, pid=1, rule="forged-rule",
                   dec="deny", reason="invented", detail='{"netdev":"eth9"}')
        write_anchor(dst, top + 2, prev)
    elif cmd == "newid":
        cut, new = int(sys.argv[4]), os.urandom(16).hex()
        rows = db.execute("SELECT seq, at_us, kind, session_id, uid, pid, rule, decision, reason, "
                          "detail FROM events WHERE seq <= ? ORDER BY seq", (cut,)).fetchall()
        db.execute("DELETE FROM sessions WHERE id IN (SELECT session_id FROM events WHERE seq > ? "
                   "AND kind = 'request-granted')", (cut,))
        db.execute("DELETE FROM events")
        db.execute("UPDATE meta SET value = ? WHERE key = 'journal_id'", (new,))
        prev = bytes(32)
        for r in rows:
            r = list(r)
            if r[2] in ("daemon-start", "retention-prune") and r[9]:
                d = json.loads(r[9])
                if "journal_id" in d:
                    d["journal_id"] = new
                r[9] = json.dumps(d, separators=(",", ":"))
            prev = add(db, prev, *r)
        write_anchor(dst, rows[-1][0], prev)
    else:
        sys.exit("usage: forge_journal.py wipe SRC DST SEQ:HASH,... | newid SRC DST CUT")
    db.commit()


main()
