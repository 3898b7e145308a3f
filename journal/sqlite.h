// Thin RAII over the sqlite3 C API: errors become knod::Error with SQLite's own message.
#pragma once

#include "knod/result.h"

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace knod::journal {

class Statement;

// A SQLite "file:" URI naming exactly `path`: every byte but [A-Za-z0-9/._~-] percent-encoded,
// so '%', '?' and '#' in a file name are part of the name, not URI syntax. `query` (like
// "mode=ro") is appended as is.
std::string file_uri(const std::string &path, const std::string &query = {});

class Database {
  public:
    static Result<Database> open(const std::string &path, int flags);
    Database(Database &&o) noexcept : db_(o.db_), cache_(std::move(o.cache_)) { o.db_ = nullptr; }
    Database &operator=(Database &&o) noexcept;
    ~Database();

    Result<void> exec(const std::string &sql);
    Result<Statement> prepare(const std::string &sql);
    // A statement prepared once per connection and reused (reset after each run): for the
    // writer's hot statements.
    Result<Statement *> cached(const std::string &sql);
    Result<std::int64_t> scalar(const std::string &sql); // first column of the first row
    Error error(const std::string &what) const;
    sqlite3 *get() const { return db_; }

  private:
    explicit Database(sqlite3 *db) : db_(db) {}
    sqlite3 *db_ = nullptr;
    std::map<std::string, std::unique_ptr<Statement>> cache_;
};

class Statement {
  public:
    Statement(sqlite3 *db, sqlite3_stmt *stmt) : db_(db), stmt_(stmt) {}
    Statement(Statement &&o) noexcept : db_(o.db_), stmt_(o.stmt_) { o.stmt_ = nullptr; }
    Statement &operator=(Statement &&) = delete;
    ~Statement() { sqlite3_finalize(stmt_); }

    Statement &bind(int i, std::int64_t v);
    Statement &bind(int i, const std::string &v);
    Statement &bind(int i, const std::optional<std::string> &v);
    Statement &bind(int i, const std::optional<std::int64_t> &v);
    Statement &bind_blob(int i, const void *data, std::size_t size);

    // True while a row is available; an error stops the iteration.
    Result<bool> step();
    Result<void> run(); // step to completion, then reset for reuse
    void reset();

    std::int64_t int64(int col) const { return sqlite3_column_int64(stmt_, col); }
    bool is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
    int type(int col) const { return sqlite3_column_type(stmt_, col); } // SQLITE_INTEGER, ...
    double real(int col) const { return sqlite3_column_double(stmt_, col); }
    std::string text(int col) const;
    // The same without a copy, valid until the next step(), reset() or column read as another type.
    std::string_view text_view(int col) const;
    std::optional<std::string> opt_text(int col) const;
    std::optional<std::int64_t> opt_int64(int col) const;
    std::string blob(int col) const;

  private:
    sqlite3 *db_;
    sqlite3_stmt *stmt_;
};

} // namespace knod::journal
