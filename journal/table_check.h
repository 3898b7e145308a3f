// The tables beside the chain, checked against the events the chain vouches for, so that every
// value `audit` shows is covered: each sessions row against its grant event's "session" values
// and its closing event's "end" values, each policies row's text against its digest (and every
// digest a policy load names has its row), meta.journal_id against the daemon-start events, and
// each checkpoint row against the retention-prune event that made it.
//
// It streams: verify feeds it every verified event in chain order, and it reads the sessions
// table beside the chain in rowid order (the order rows were written, which is the order of
// their grant events), holding only sessions opened and not yet closed (and rows that are out
// of that order, which only tampering or an older build's retention leaves).
#pragma once

#include "journal/records.h"
#include "journal/sqlite.h"
#include "knod/result.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace knod::journal {

struct TableProblem {
    std::int64_t seq = 0; // the event concerned; 0 when only a row is
    std::string what;
};

struct TableCounts {
    std::int64_t sessions_checked = 0;     // rows compared with the values their events carry
    std::int64_t sessions_not_covered = 0; // opened by an older build: no values in the chain
    std::int64_t policies_checked = 0;     // stored policy texts that match their digests
};

class TableCheck {
  public:
    // Inside the caller's read transaction on `db`; `schema_version`: its user_version.
    static Result<std::unique_ptr<TableCheck>> open(Database &db, std::int64_t schema_version);
    ~TableCheck();

    // Each event the chain walk verified, in chain order. An error is a read failure.
    Result<void> event(std::int64_t seq, const Event &e);
    // After a whole intact chain: the rows no event explained, the policies, the checkpoints.
    // `first_seq`: the chain's first event (above 1 after retention). `pruned_by_this_build`:
    // the prune the chain starts from (the checkpoint at first_seq - 1) records its retention,
    // so it was made by a build that removes every row whose grant it removed: such a row left
    // is inserted, where after an older build's prune it is only "not covered".
    Result<void> finish(std::int64_t first_seq, bool pruned_by_this_build = false);

    // The first problem found (tampering), if any.
    const std::optional<TableProblem> &problem() const { return problem_; }
    const TableCounts &counts() const { return counts_; }

  private:
    struct State;
    explicit TableCheck(std::unique_ptr<State> state);
    void report(std::int64_t seq, std::string what);

    std::unique_ptr<State> s_;
    std::optional<TableProblem> problem_;
    TableCounts counts_;
};

} // namespace knod::journal
