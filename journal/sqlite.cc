#include "journal/sqlite.h"

#include "knod/regular_file.h"

#include <sys/stat.h>

#include <cctype>

namespace knod::journal {
namespace {

Errc code_for(int rc) {
    switch (rc & 0xff) {
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return Errc::unavailable;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return Errc::corrupt;
    default:
        return Errc::io;
    }
}

// The file a path or a file: URI (as file_uri() writes them) names.
std::string file_of(const std::string &path) {
    if (!path.starts_with("file:")) return path;
    std::string rest = path.substr(path.starts_with("file://") ? 7 : 5);
    rest = rest.substr(0, rest.find('?'));
    std::string out;
    for (std::size_t i = 0; i < rest.size(); ++i) {
        if (rest[i] == '%' && i + 2 < rest.size() &&
            std::isxdigit(static_cast<unsigned char>(rest[i + 1])) &&
            std::isxdigit(static_cast<unsigned char>(rest[i + 2]))) {
            out += static_cast<char>(std::stoi(rest.substr(i + 1, 2), nullptr, 16));
            i += 2;
        } else {
            out += rest[i];
        }
    }
    return out;
}

} // namespace

std::string file_uri(const std::string &path, const std::string &query) {
    static constexpr char hex[] = "0123456789ABCDEF";
    // "file:" then the path; an absolute one gets an empty authority ("file:///x") so a path
    // starting with "//" is not read as a host name.
    std::string out = path.starts_with('/') ? "file://" : "file:";
    for (unsigned char c : path) {
        if (std::isalnum(c) || c == '/' || c == '.' || c == '_' || c == '~' || c == '-') {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += hex[c >> 4];
            out += hex[c & 0xf];
        }
    }
    if (!query.empty()) out += "?" + query;
    return out;
}

Result<Database> Database::open(const std::string &path, int flags) {
    // SQLite would open a FIFO and wait for a writer, or a device: only a regular file (or none
    // yet, to be created) is a database.
    struct stat st {};
    if (std::string file = file_of(path); stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
        return make_error(Errc::invalid_argument, "open " + file + ": it is " +
                                                      file_kind(st.st_mode) +
                                                      ", not a database file");
    sqlite3 *db = nullptr;
    int rc = sqlite3_open_v2(path.c_str(), &db, flags | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) {
        std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
        sqlite3_close(db);
        return make_error(code_for(rc), "open " + path + ": " + msg);
    }
    sqlite3_extended_result_codes(db, 1);
    sqlite3_busy_timeout(db, 5000);
    return Database(db);
}

Database &Database::operator=(Database &&o) noexcept {
    if (this != &o) {
        cache_.clear();
        sqlite3_close(db_);
        db_ = o.db_;
        cache_ = std::move(o.cache_);
        o.db_ = nullptr;
    }
    return *this;
}

Database::~Database() {
    cache_.clear(); // statements first: a connection with live statements does not close
    sqlite3_close(db_);
}

Result<Statement *> Database::cached(const std::string &sql) {
    auto it = cache_.find(sql);
    if (it != cache_.end()) return it->second.get();
    auto st = prepare(sql);
    if (!st) return st.error();
    auto owned = std::make_unique<Statement>(std::move(*st));
    Statement *raw = owned.get();
    cache_.emplace(sql, std::move(owned));
    return raw;
}

Error Database::error(const std::string &what) const {
    return make_error(code_for(sqlite3_extended_errcode(db_)), what + ": " + sqlite3_errmsg(db_));
}

Result<void> Database::exec(const std::string &sql) {
    char *msg = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &msg);
    if (rc != SQLITE_OK) {
        std::string text = msg ? msg : sqlite3_errstr(rc);
        sqlite3_free(msg);
        return make_error(code_for(rc), text);
    }
    return {};
}

Result<Statement> Database::prepare(const std::string &sql) {
    sqlite3_stmt *stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK)
        return error("prepare '" + sql + "'");
    return Statement(db_, stmt);
}

Result<std::int64_t> Database::scalar(const std::string &sql) {
    auto st = prepare(sql);
    if (!st) return st.error();
    auto row = st->step();
    if (!row) return row.error();
    if (!*row) return make_error(Errc::not_found, "no row for '" + sql + "'");
    return st->int64(0);
}

Statement &Statement::bind(int i, std::int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
}

Statement &Statement::bind(int i, const std::string &v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
}

Statement &Statement::bind(int i, const std::optional<std::string> &v) {
    if (v) return bind(i, *v);
    sqlite3_bind_null(stmt_, i);
    return *this;
}

Statement &Statement::bind(int i, const std::optional<std::int64_t> &v) {
    if (v) return bind(i, *v);
    sqlite3_bind_null(stmt_, i);
    return *this;
}

Statement &Statement::bind_blob(int i, const void *data, std::size_t size) {
    sqlite3_bind_blob(stmt_, i, data, static_cast<int>(size), SQLITE_TRANSIENT);
    return *this;
}

Result<bool> Statement::step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    if ((rc & 0xff) == SQLITE_INTERRUPT) // only the audit's progress handler interrupts
        return make_error(Errc::unavailable,
                          "the query was stopped: it ran past the time budget of the audit's "
                          "connection (KNOD_AUDIT_TIME_BUDGET; a runaway query on a hostile "
                          "journal?)");
    return make_error(code_for(rc), sqlite3_errmsg(db_));
}

Result<void> Statement::run() {
    auto r = step();
    while (r && *r)
        r = step();
    reset();
    if (!r) return r.error();
    return {};
}

void Statement::reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
}

std::string_view Statement::text_view(int col) const {
    auto *p = sqlite3_column_text(stmt_, col);
    return p ? std::string_view(reinterpret_cast<const char *>(p),
                                static_cast<std::size_t>(sqlite3_column_bytes(stmt_, col)))
             : std::string_view();
}

std::string Statement::text(int col) const {
    return std::string(text_view(col));
}

std::optional<std::string> Statement::opt_text(int col) const {
    if (is_null(col)) return std::nullopt;
    return text(col);
}

std::optional<std::int64_t> Statement::opt_int64(int col) const {
    if (is_null(col)) return std::nullopt;
    return int64(col);
}

std::string Statement::blob(int col) const {
    auto *p = static_cast<const char *>(sqlite3_column_blob(stmt_, col));
    return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, col)))
             : std::string();
}

} // namespace knod::journal
