#include "journal/journal.h"
#include "knod/system_error.h"

#include "journal/migrations.h"
#include "journal/retention.h"

#include "knod/json.h"
#include "knod/untrusted.h"
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace knod::journal {
namespace {

// The caller's detail (a JSON object, or none) with `key` set to `value`: what the journal
// vouches for goes into whatever the caller wrote, so no caller can leave it out.
Result<std::string> merge_detail(const std::optional<std::string> &detail, const char *key,
                                 nlohmann::json value) {
    nlohmann::json j = nlohmann::json::object();
    if (detail) {
        j = nlohmann::json::parse(*detail, nullptr, false);
        if (!j.is_object())
            return make_error(Errc::invalid_argument, "event detail is not a JSON object");
    }
    j[key] = std::move(value);
    return knod::dump_json(j);
}

// A grant event's "session": every column of the row as written (not handoff: see verify.cc).
nlohmann::json session_values(const Session &s) {
    return {{"id", s.id},
            {"uid", std::int64_t{s.uid}},
            {"pid", s.pid},
            {"exe", s.exe},
            {"unit", s.unit},
            {"netdev", s.netdev},
            {"gpu", s.gpu},
            {"mode", s.mode},
            {"region_bytes", static_cast<std::int64_t>(s.region_bytes)},
            {"flows", s.flows},
            {"key_id", s.key_id},
            {"rule", s.rule},
            {"started_us", s.started_us}};
}

// The values as their JSON text reads back: strings that are not UTF-8 get U+FFFD, as the
// event's detail will have them. Where every string already is UTF-8 the text would read back
// the same values, so the dump and parse (about a twentieth of a grant's work, #54) are skipped.
bool all_utf8(const nlohmann::json &j) {
    if (j.is_string()) {
        const auto &s = j.get_ref<const std::string &>();
        char32_t cp = 0;
        for (std::size_t i = 0; i < s.size();) {
            std::size_t n = knod::utf8_sequence(s, i, cp);
            if (n == 0) return false;
            i += n;
        }
        return true;
    }
    if (j.is_structured())
        return std::all_of(j.begin(), j.end(), [](const nlohmann::json &v) { return all_utf8(v); });
    return true;
}

nlohmann::json as_written(nlohmann::json values) {
    if (all_utf8(values)) return values;
    return nlohmann::json::parse(knod::dump_json(values), nullptr, false);
}

// A closing event's "end": the values the row gets when the session ends.
nlohmann::json end_values(std::int64_t at, const std::string &reason, const Counters &c) {
    return {{"ended_us", at},
            {"end_reason", reason},
            {"rx_bytes", static_cast<std::int64_t>(c.rx_bytes)},
            {"rx_packets", static_cast<std::int64_t>(c.rx_packets)},
            {"dropped_packets", static_cast<std::int64_t>(c.dropped_packets)}};
}

} // namespace

int latest_schema_version() {
    int v = 0;
    for (auto &m : migrations())
        v = std::max(v, m.version);
    return v;
}

Result<Database> open_and_migrate(const std::string &path) {
    auto db = Database::open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    if (!db) return db.error();
    for (const char *pragma :
         {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON",
          // A WAL that grew while a reader held its snapshot is cut back to this when it
          // restarts, instead of keeping its largest size for ever.
          "PRAGMA journal_size_limit=16777216"}) {
        if (auto r = db->exec(pragma); !r) return std::move(r).error().context(path);
    }
    auto version = db->scalar("PRAGMA user_version");
    if (!version) return std::move(version).error().context(path);
    int latest = latest_schema_version();
    if (*version > latest)
        return make_error(Errc::too_new, path + ": journal schema version " +
                                             std::to_string(*version) +
                                             " is newer than this build knows (" +
                                             std::to_string(latest) + "); upgrade knod-policy");
    for (auto &m : migrations()) {
        if (m.version <= *version) continue;
        std::string sql = "BEGIN IMMEDIATE;\n" + std::string(m.sql) +
                          "\nPRAGMA user_version = " + std::to_string(m.version) + ";\nCOMMIT;";
        if (auto r = db->exec(sql); !r) {
            (void)db->exec("ROLLBACK");
            return std::move(r).error().context(path + ": migration " + std::string(m.name));
        }
    }
    return db;
}

// Owns the connection and the chain head; used only on the writer thread.
class Journal::Writer {
  public:
    static Result<std::unique_ptr<Writer>> open(const std::string &path) {
        auto db = open_and_migrate(path);
        if (!db) return db.error();
        // Prepared before the writer exists: a failure is an error here, never a throw.
        auto insert = db->prepare("INSERT INTO events (seq, at_us, kind, session_id, uid, pid, "
                                  "rule, decision, reason, detail, prev_hash, hash) VALUES "
                                  "(?,?,?,?,?,?,?,?,?,?,?,?)");
        if (!insert) return std::move(insert).error().context(path + ": events table");
        auto w = std::unique_ptr<Writer>(new Writer(std::move(*db), std::move(*insert)));
        if (auto r = w->load_head(); !r) return r.error();
        return w;
    }

    Database &db() { return db_; }

    Result<std::int64_t> append(Event e) {
        if (e.at_us == 0) e.at_us = now_us();
        std::int64_t seq = head_seq_ + 1;
        Hash hash = chain_hash(head_hash_, seq, e);
        auto &st = insert_event_;
        st.bind(1, seq).bind(2, e.at_us).bind(3, e.kind).bind(4, e.session_id).bind(5, e.uid);
        st.bind(6, e.pid).bind(7, e.rule).bind(8, e.decision).bind(9, e.reason).bind(10, e.detail);
        st.bind_blob(11, head_hash_.data(), head_hash_.size());
        st.bind_blob(12, hash.data(), hash.size());
        if (auto r = st.run(); !r) return r.error();
        head_seq_ = seq;
        head_hash_ = hash;
        return seq;
    }

    // Transaction edges. The chain head moves with each append; a rollback puts it back.
    Result<void> begin() {
        committed_seq_ = head_seq_;
        committed_hash_ = head_hash_;
        return run_cached("BEGIN IMMEDIATE");
    }
    Result<void> commit() {
        auto r = run_cached("COMMIT");
        if (!r) {
            rollback();
            return r;
        }
        return r;
    }
    std::int64_t head_seq() const { return head_seq_; }
    const Hash &head_hash() const { return head_hash_; }
    // A passive checkpoint (it never waits for a reader): how many WAL frames there are and
    // how many a reader's snapshot keeps out of the database. Nullopt if SQLite refused.
    // SQLITE_BUSY: another process holds the checkpoint lock (a reader of the journal's group
    // can hold it on -shm): nothing is checkpointed while it lasts, and that is said too.
    struct Checkpoint {
        bool blocked = false;
        int frames = 0, held = 0;
    };
    Checkpoint checkpoint() {
        int log = 0, done = 0;
        int rc =
            sqlite3_wal_checkpoint_v2(db_.get(), nullptr, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
        if (rc != SQLITE_OK) return {true, 0, 0};
        return {false, log, log - done};
    }
    // After a commit that moved the head (run() decides when: see there).
    Result<void> update_anchor() { return write_anchor(); }
    // The anchor is read by whoever may read the database (the auditors' group): it gets the
    // database's read bits, never more than 0640.
    void set_anchor(std::string path, mode_t mode) {
        anchor_ = std::move(path);
        anchor_mode_ = (mode & 0640) | 0600;
    }
    void rollback() {
        (void)db_.exec("ROLLBACK");
        head_seq_ = committed_seq_;
        head_hash_ = committed_hash_;
    }
    // Savepoints let one failed call leave the others in its batch untouched.
    Result<void> savepoint() {
        saved_seq_ = head_seq_;
        saved_hash_ = head_hash_;
        return run_cached("SAVEPOINT op");
    }
    void release() { (void)run_cached("RELEASE op"); }
    void rollback_to_savepoint() {
        (void)db_.exec("ROLLBACK TO op; RELEASE op");
        head_seq_ = saved_seq_;
        head_hash_ = saved_hash_;
    }

  private:
    // Transaction edges run several times a commit: prepared once, not parsed each time
    // (sqlite3_exec's parse was an eighth of the daemon's instructions per pair, callgrind).
    Result<void> run_cached(const char *sql) {
        auto st = db_.cached(sql);
        if (!st) return st.error();
        return (*st)->run();
    }

    // The head goes beside the database after each commit (write_anchor_file: a fresh
    // temporary file renamed over, not synced). A failure (a full disk, the fd limit) is
    // returned, for run() to count and show: the anchor must not stop advancing in silence.
    Result<void> write_anchor() {
        if (anchor_.empty()) return {};
        return write_anchor_file(
            anchor_,
            knod::dump_json(nlohmann::json{{"seq", head_seq_}, {"hash", to_hex(head_hash_)}}) +
                "\n",
            anchor_mode_);
    }

    Writer(Database db, Statement insert_event)
        : db_(std::move(db)), insert_event_(std::move(insert_event)) {}

    Result<void> load_head() {
        auto head = read_head(db_);
        if (!head) return head.error();
        if (*head) {
            head_seq_ = (*head)->seq;
            head_hash_ = (*head)->hash;
        }
        return {};
    }

    Database db_;
    Statement insert_event_;
    std::int64_t head_seq_ = 0;
    Hash head_hash_{};
    std::string anchor_;
    mode_t anchor_mode_ = 0600;
    std::int64_t committed_seq_ = 0, saved_seq_ = 0;
    Hash committed_hash_{}, saved_hash_{};
};

Result<std::optional<ChainHead>> read_head(Database &db) {
    auto st = db.prepare("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1");
    if (!st) return st.error();
    auto row = st->step();
    if (!row) return row.error();
    if (!*row) return std::optional<ChainHead>();
    ChainHead head;
    head.seq = st->int64(0);
    std::string h = st->blob(1);
    if (h.size() != head.hash.size())
        return make_error(Errc::corrupt, "last event has a malformed hash");
    std::copy(h.begin(), h.end(), head.hash.begin());
    return std::optional<ChainHead>(head);
}

Result<std::unique_ptr<Journal>> Journal::open(const std::string &path) {
    return open(path, default_anchor_interval);
}

Result<std::unique_ptr<Journal>> Journal::open(const std::string &path,
                                               std::chrono::milliseconds anchor_interval) {
    auto writer = Writer::open(path);
    if (!writer) return std::move(writer).error().context("journal");
    struct stat st {};
    (*writer)->set_anchor(anchor_path(path), ::stat(path.c_str(), &st) == 0 ? st.st_mode : 0600);
    if (auto r = write_host((*writer)->db(), this_host()); !r)
        return std::move(r).error().context("journal " + path);
    auto identity = read_identity((*writer)->db());
    if (!identity) return std::move(identity).error().context("journal " + path);
    return std::unique_ptr<Journal>(
        new Journal(path, std::move(*identity), std::move(*writer), anchor_interval));
}

Journal::Journal(std::string path, JournalIdentity identity, std::unique_ptr<Writer> writer,
                 std::chrono::milliseconds anchor_interval)
    : anchor_interval_(anchor_interval), path_(std::move(path)), identity_(std::move(identity)),
      writer_(std::move(writer)), thread_([this] { run(); }) {}

Journal::~Journal() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void Journal::submit_async(Work work, Done done, bool lingers, bool blocking) {
    {
        std::lock_guard lock(mu_);
        if (!stopping_) {
            queue_.push_back({std::move(work), std::move(done), lingers, blocking,
                              std::chrono::steady_clock::now()});
            wake_.notify_one();
            return;
        }
    }
    if (done) done(make_error(Errc::unavailable, "journal is closing"));
}

Result<std::int64_t> Journal::submit(Work work) {
    auto promise = std::make_shared<std::promise<Result<std::int64_t>>>();
    auto result = promise->get_future();
    submit_async(
        std::move(work), [promise](Result<std::int64_t> r) { promise->set_value(std::move(r)); },
        false, true);
    return result.get();
}

void Journal::run() {
    // A name `top -H`, /proc/PID/task/*/comm and the control bench know it by.
    pthread_setname_np(pthread_self(), "knod-journal");
    for (;;) {
        std::deque<Pending> batch;
        {
            std::unique_lock lock(mu_);
            auto ready = [this] { return stopping_ || !queue_.empty(); };
            if (anchor_pending_ && anchor_written_)
                wake_.wait_until(lock, *anchor_written_ + anchor_interval_, ready);
            else
                wake_.wait(lock, ready);
            if (queue_.empty()) {
                if (!anchor_pending_) return; // stopping, and nothing is owed
                lock.unlock();
                write_anchor_now(); // its interval passed, or the journal closes
                continue;
            }
            // Only records nobody waits for: give a call that waits the chance to share the
            // commit (FIFO still: they go first in it).
            auto only_lingering = [this] {
                return std::all_of(queue_.begin(), queue_.end(),
                                   [](const Pending &p) { return p.lingers; });
            };
            if (!stopping_ && only_lingering())
                wake_.wait_until(lock, queue_.front().queued + linger,
                                 [&] { return stopping_ || !only_lingering(); });
            batch.swap(queue_);
        }
        Writer &w = *writer_;
        std::vector<Result<std::int64_t>> results;
        results.reserve(batch.size());
        // Before the batch's work: each append moves the head, the commit does not.
        std::int64_t head_before = w.head_seq();
        auto begun = w.begin();
        for (auto &p : batch) {
            if (!begun) {
                results.push_back(begun.error());
                continue;
            }
            if (auto sp = w.savepoint(); !sp) {
                results.push_back(sp.error());
                continue;
            }
            auto r = p.work(w);
            if (r)
                w.release();
            else
                w.rollback_to_savepoint();
            results.push_back(std::move(r));
        }
        bool committed = false;
        if (begun) {
            auto c = w.commit();
            committed = c.ok();
            if (!committed) {
                Error e = std::move(c).error().context("commit");
                for (auto &r : results)
                    if (r) r = e;
            }
        }
        std::uint64_t failures = 0;
        for (auto &r : results)
            failures += r ? 0 : 1;
        {
            std::lock_guard lock(mu_);
            stats_.operations += batch.size();
            stats_.transactions += committed ? 1 : 0;
            stats_.failures += failures;
            if (begun && !committed) ++stats_.commit_failures;
            for (auto &r : results)
                if (!r) stats_.last_error = r.error().message;
            if (committed) stats_.last_error.clear();
        }
        std::function<void(std::int64_t, const Hash &)> listener;
        {
            std::lock_guard lock(mu_);
            listener = on_commit_;
        }
        bool moved = committed && w.head_seq() != head_before;
        // The anchor (a rename beside the database, not synced: verify accepts one that is
        // behind) is no part of what a caller waits for: an asynchronous caller hears first and
        // the anchor follows, before the next batch; a caller blocked in a synchronous call
        // (tests, the CLI, shutdown) gets it written before it returns, as it may read it next.
        bool anchor_first =
            std::any_of(batch.begin(), batch.end(), [](const Pending &p) { return p.blocking; });
        if (moved && anchor_first) write_anchor_now();
        if (moved && listener) listener(w.head_seq(), w.head_hash());
        for (std::size_t i = 0; i < batch.size(); ++i)
            if (batch[i].done) batch[i].done(std::move(results[i]));
        // Otherwise at most once per interval (journal.h): now if the last is that old, else
        // when the wait above times out, whichever commit comes last.
        if (moved && !anchor_first) {
            if (!anchor_written_ ||
                std::chrono::steady_clock::now() - *anchor_written_ >= anchor_interval_)
                write_anchor_now();
            else
                anchor_pending_ = true;
        }
        // SQLite's own checkpoints (every ~1,000 pages, at commit) fail in silence while a
        // reader holds an old snapshot: look every 64 commits and say how much is held back.
        if (committed && ++commits_since_checkpoint_ >= 64) {
            commits_since_checkpoint_ = 0;
            auto wal = w.checkpoint();
            struct stat st {};
            bool sized = ::stat((path_ + "-wal").c_str(), &st) == 0;
            std::lock_guard lock(mu_);
            stats_.checkpoint_blocked = wal.blocked;
            stats_.wal_bytes = sized ? static_cast<std::uint64_t>(st.st_size) : 0;
            if (!wal.blocked) {
                stats_.wal_frames = static_cast<std::uint64_t>(wal.frames);
                stats_.wal_frames_held = static_cast<std::uint64_t>(std::max(0, wal.held));
            }
        }
    }
}

Result<std::int64_t> Journal::append(Event event) {
    return submit([e = std::move(event)](Writer &w) mutable { return w.append(std::move(e)); });
}

void Journal::append_soon(Event event, Done done) {
    submit_async([e = std::move(event)](Writer &w) mutable { return w.append(std::move(e)); },
                 std::move(done), true);
}

void Journal::append_async(Event event, Done done) {
    submit_async([e = std::move(event)](Writer &w) mutable { return w.append(std::move(e)); },
                 std::move(done));
}

Result<std::int64_t> Journal::append_policy_load(Event load, PolicyText policy) {
    return submit(policy_load_work(std::move(load), std::move(policy)));
}

void Journal::append_policy_load_async(Event load, PolicyText policy, Done done) {
    submit_async(policy_load_work(std::move(load), std::move(policy)), std::move(done));
}

Journal::Work Journal::policy_load_work(Event e, PolicyText p) {
    return [e = std::move(e), p = std::move(p)](Writer &w) mutable -> Result<std::int64_t> {
        auto detail = merge_detail(e.detail, "policy", p.digest);
        if (!detail) return std::move(detail).error().context("policy load");
        if (e.at_us == 0) e.at_us = now_us();
        auto st = w.db().cached(
            "INSERT OR IGNORE INTO policies (digest, text, first_loaded_us) VALUES (?,?,?)");
        if (!st) return st.error();
        (*st)->bind(1, p.digest).bind(2, p.text).bind(3, e.at_us);
        if (auto r = (*st)->run(); !r) return std::move(r).error().context("policy " + p.digest);
        e.detail = std::move(*detail);
        return w.append(std::move(e));
    };
}

Result<std::int64_t> Journal::open_session(Session s, Event grant) {
    return submit(open_session_work(std::move(s), std::move(grant)));
}

void Journal::open_session_async(Session s, Event grant, Done done) {
    submit_async(open_session_work(std::move(s), std::move(grant)), std::move(done));
}

Journal::Work Journal::open_session_work(Session s, Event grant) {
    return [s = std::move(s), e = std::move(grant)](Writer &w) mutable -> Result<std::int64_t> {
        if (s.started_us == 0) s.started_us = now_us();
        // The row gets exactly the values the event carries: strings go through the same JSON
        // text first (bytes that are not UTF-8 become U+FFFD in both), numbers as stored.
        auto written = as_written(session_values(s));
        if (!written.is_object())
            return make_error(Errc::invalid_argument, "session " + s.id + ": unreadable values");
        auto detail = merge_detail(e.detail, "session", written);
        if (!detail) return std::move(detail).error().context("session " + s.id);
        auto text = [&](const char *k) { return written.at(k).get<std::string>(); };
        auto st = w.db().cached("INSERT INTO sessions (id, uid, pid, exe, unit, netdev, gpu, "
                                "mode, region_bytes, flows, "
                                "key_id, rule, started_us) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)");
        if (!st) return st.error();
        (*st)
            ->bind(1, text("id"))
            .bind(2, std::int64_t{s.uid})
            .bind(3, s.pid)
            .bind(4, text("exe"))
            .bind(5, text("unit"));
        (*st)->bind(6, text("netdev")).bind(7, text("gpu")).bind(8, text("mode"));
        (*st)->bind(9, static_cast<std::int64_t>(s.region_bytes));
        (*st)
            ->bind(10, knod::dump_json(written.at("flows")))
            .bind(11, text("key_id"))
            .bind(12, text("rule"));
        (*st)->bind(13, s.started_us);
        if (auto r = (*st)->run(); !r) return std::move(r).error().context("session " + s.id);
        e.session_id = text("id");
        e.at_us = s.started_us;
        e.detail = std::move(*detail);
        return w.append(std::move(e));
    };
}

namespace {

// Ends the row and puts the values it gets into the closing event `e` (stamped: at_us set).
// The reason goes through the event's JSON text first, so the row holds exactly what it says.
Result<void> end_session(Database &db, const std::string &id, const std::string &why,
                         const Counters &c, Event &e) {
    std::int64_t at = e.at_us;
    auto end = as_written(end_values(at, why, c));
    if (!end.is_object())
        return make_error(Errc::invalid_argument, "session " + id + ": unreadable end values");
    auto detail = merge_detail(e.detail, "end", end);
    if (!detail) return std::move(detail).error().context("session " + id);
    std::string reason = end.at("end_reason").get<std::string>();
    auto st = db.cached("UPDATE sessions SET ended_us = ?, end_reason = ?, rx_bytes = ?, "
                        "rx_packets = ?, dropped_packets = ? WHERE id = ? AND ended_us IS NULL");
    if (!st) return st.error();
    (*st)->bind(1, at).bind(2, reason).bind(3, static_cast<std::int64_t>(c.rx_bytes));
    (*st)->bind(4, static_cast<std::int64_t>(c.rx_packets));
    (*st)->bind(5, static_cast<std::int64_t>(c.dropped_packets)).bind(6, id);
    if (auto r = (*st)->run(); !r) return r.error();
    if (sqlite3_changes(db.get()) != 1) return make_error(Errc::not_found, "no open session " + id);
    e.session_id = id;
    e.detail = std::move(*detail);
    return {};
}

} // namespace

Result<std::int64_t> Journal::close_session(const std::string &id, const std::string &reason,
                                            const Counters &counters, Event closing) {
    return submit(close_session_work(id, reason, counters, std::move(closing)));
}

void Journal::close_session_async(const std::string &id, const std::string &reason,
                                  const Counters &counters, Event closing, Done done) {
    submit_async(close_session_work(id, reason, counters, std::move(closing)), std::move(done));
}

Journal::Work Journal::close_session_work(const std::string &id, const std::string &reason,
                                          const Counters &counters, Event closing) {
    return [=, e = std::move(closing)](Writer &w) mutable -> Result<std::int64_t> {
        if (e.at_us == 0) e.at_us = now_us();
        if (auto r = end_session(w.db(), id, reason, counters, e); !r) return r.error();
        if (!e.reason) e.reason = reason;
        return w.append(std::move(e));
    };
}

Result<void> Journal::hand_off(const std::map<std::string, std::string> &handoffs) {
    auto r = submit([handoffs](Writer &w) -> Result<std::int64_t> {
        for (auto &[id, json] : handoffs) {
            auto st =
                w.db().cached("UPDATE sessions SET handoff = ? WHERE id = ? AND ended_us IS NULL");
            if (!st) return st.error();
            (*st)->bind(1, json).bind(2, id);
            if (auto run = (*st)->run(); !run) return run.error();
        }
        return std::int64_t{0};
    });
    if (!r) return r.error();
    return {};
}

Result<std::map<std::string, std::string>> Journal::take_handoffs() {
    auto taken = std::make_shared<std::map<std::string, std::string>>();
    auto r = submit([taken](Writer &w) -> Result<std::int64_t> {
        auto st = w.db().prepare("SELECT id, handoff FROM sessions WHERE ended_us IS NULL AND "
                                 "handoff IS NOT NULL");
        if (!st) return st.error();
        for (auto row = st->step(); row && *row; row = st->step())
            taken->emplace(st->text(0), st->text(1));
        if (auto clear =
                w.db().exec("UPDATE sessions SET handoff = NULL WHERE handoff IS NOT NULL");
            !clear)
            return clear.error();
        return std::int64_t{0};
    });
    if (!r) return r.error();
    return std::move(*taken);
}

Result<std::optional<std::string>> Journal::last_stop_detail() {
    auto found = std::make_shared<std::optional<std::string>>();
    auto r = submit([found](Writer &w) -> Result<std::int64_t> {
        auto st = w.db().prepare("SELECT kind, detail FROM events WHERE kind IN (?, ?) ORDER BY "
                                 "seq DESC LIMIT 1");
        if (!st) return st.error();
        st->bind(1, std::string(kind::daemon_start)).bind(2, std::string(kind::daemon_stop));
        auto row = st->step();
        if (!row) return row.error();
        if (*row && st->text(0) == kind::daemon_stop) *found = st->text(1);
        return std::int64_t{0};
    });
    if (!r) return r.error();
    return std::move(*found);
}

Result<std::vector<std::string>> Journal::close_open_sessions(const std::string &reason,
                                                              const std::set<std::string> &keep) {
    auto closed = std::make_shared<std::vector<std::string>>();
    auto r = submit([reason, closed, keep](Writer &w) -> Result<std::int64_t> {
        auto st = w.db().prepare("SELECT id, uid, pid, rx_bytes, rx_packets, dropped_packets "
                                 "FROM sessions WHERE ended_us IS NULL ORDER BY started_us");
        if (!st) return st.error();
        struct Open {
            std::string id;
            std::int64_t uid, pid;
            Counters c;
        };
        std::vector<Open> open;
        for (auto row = st->step(); row && *row; row = st->step()) {
            if (keep.count(st->text(0))) continue;
            open.push_back({st->text(0),
                            st->int64(1),
                            st->int64(2),
                            {static_cast<std::uint64_t>(st->int64(3)),
                             static_cast<std::uint64_t>(st->int64(4)),
                             static_cast<std::uint64_t>(st->int64(5))}});
        }
        std::int64_t last = 0;
        for (auto &o : open) {
            Event e;
            e.at_us = now_us();
            e.kind = kind::ended;
            e.session_id = o.id;
            e.uid = o.uid;
            e.pid = o.pid;
            e.reason = reason;
            if (auto ended = end_session(w.db(), o.id, reason, o.c, e); !ended)
                return ended.error();
            auto seq = w.append(std::move(e));
            if (!seq) return seq.error();
            last = *seq;
            closed->push_back(o.id);
        }
        return last;
    });
    if (!r) return r.error();
    return std::move(*closed);
}

Result<std::int64_t> Journal::prune(std::optional<std::int64_t> before_us,
                                    std::optional<std::int64_t> keep_events,
                                    std::optional<std::int64_t> retain_age_us) {
    // The journal's id inside the chain: a pruned journal may keep no daemon-start, and verify
    // checks meta's id (which the system journal's copies are matched by) against it.
    return submit([=, journal_id = identity_.journal_id](Writer &w) -> Result<std::int64_t> {
        Database &db = w.db();
        // One clock reading for the cut and the record: the event then says exactly what the
        // age setting allowed at the prune's own time.
        std::int64_t pruned_at = now_us();
        std::optional<std::int64_t> before = before_us;
        if (retain_age_us) before = pruned_at - *retain_age_us;
        // The last event that may go: old enough (or beyond the count), and older than the
        // oldest open session's first event, so a live session keeps its whole trail.
        std::int64_t cut = 0;
        if (before) {
            auto st = db.prepare("SELECT coalesce(max(seq), 0) FROM events WHERE at_us < ?");
            if (!st) return st.error();
            st->bind(1, *before);
            if (auto row = st->step(); !row) return row.error();
            cut = std::max(cut, st->int64(0));
        }
        if (keep_events) cut = std::max(cut, w.head_seq() - *keep_events);
        auto open = db.scalar("SELECT coalesce(min(e.seq), 0) FROM events e JOIN sessions s "
                              "ON s.id = e.session_id WHERE s.ended_us IS NULL");
        if (!open) return open.error();
        if (*open) cut = std::min(cut, *open - 1);
        cut = std::min(cut, w.head_seq() - 1); // the head stays: it anchors what comes next
        auto first = db.scalar("SELECT coalesce(min(seq), 0) FROM events");
        if (!first) return first.error();
        if (cut < *first) return std::int64_t{0};
        auto st = db.prepare("SELECT hash, at_us FROM events WHERE seq = ?");
        if (!st) return st.error();
        st->bind(1, cut);
        if (auto row = st->step(); !row || !*row)
            return make_error(Errc::corrupt, "no event " + std::to_string(cut));
        std::string hash = st->blob(0);
        std::int64_t through_at = st->int64(1);
        std::int64_t removed = cut - *first + 1;
        auto ins = db.prepare(
            "INSERT INTO checkpoints (seq, hash, pruned_at_us, events) VALUES (?,?,?,?)");
        if (!ins) return ins.error();
        ins->bind(1, cut)
            .bind_blob(2, hash.data(), hash.size())
            .bind(3, pruned_at)
            .bind(4, removed);
        if (auto r = ins->run(); !r) return r.error();
        // Every row whose grant event goes or is gone (verify wants a row for every grant in
        // the chain and a grant for every row, and takes a row left with its grant pruned as
        // inserted once a prune of this build, which records its retention, starts the chain);
        // that includes rows an older build's prune left behind. Open sessions keep their
        // trail (cut above), so none of these is open.
        std::string gone = "DELETE FROM sessions WHERE id NOT IN (SELECT session_id FROM events "
                           "WHERE seq > " +
                           std::to_string(cut) + " AND session_id IS NOT NULL AND kind = '" +
                           kind::granted + "')";
        if (auto r = db.exec(gone); !r) return r.error();
        // The append-only trigger is lifted for this one statement, inside this transaction.
        std::string del = "DROP TRIGGER events_no_delete; DELETE FROM events WHERE seq <= " +
                          std::to_string(cut) +
                          "; CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN SELECT "
                          "RAISE(ABORT, 'events are append-only'); END;";
        if (auto r = db.exec(del); !r) return r.error();
        // The event repeats every field of the checkpoint row, so verify can check the row.
        Event e;
        e.kind = kind::prune;
        e.at_us = pruned_at;
        nlohmann::json detail{{"pruned_through", cut},
                              {"hash", to_hex(*reinterpret_cast<const Hash *>(hash.data()))},
                              {"events", removed},
                              {"pruned_at_us", pruned_at},
                              {"through_at_us", through_at},
                              {"retention", retention_json(retain_age_us, keep_events)}};
        if (!journal_id.empty()) detail["journal_id"] = journal_id;
        e.detail = knod::dump_json(detail);
        auto seq = w.append(std::move(e));
        if (!seq) return seq.error();
        return removed;
    });
}

void Journal::set_commit_listener(std::function<void(std::int64_t, const Hash &)> listener) {
    std::lock_guard lock(mu_);
    on_commit_ = std::move(listener);
}

void Journal::write_anchor_now() {
    note_anchor(writer_->update_anchor());
    anchor_written_ = std::chrono::steady_clock::now();
    anchor_pending_ = false;
}

void Journal::note_anchor(Result<void> written) {
    std::lock_guard lock(mu_);
    if (written) {
        ++stats_.anchor_writes;
        stats_.anchor_failing.clear();
        return;
    }
    ++stats_.anchor_failures;
    stats_.anchor_failing = written.error().message;
}

JournalStats Journal::stats() const {
    std::lock_guard lock(mu_);
    return stats_;
}

} // namespace knod::journal
