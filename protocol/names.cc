#include "protocol/names.h"

#include <utility>

namespace knod::bus {
namespace {

const std::pair<Errc, const char *> table[] = {
    {Errc::denied, error::denied},
    {Errc::wrong_holder, error::denied},
    {Errc::wrong_region, error::denied},
    {Errc::bad_key, error::denied},
    {Errc::expired, error::denied},
    {Errc::revoked, error::denied},
    {Errc::invalid_argument, error::invalid_argument},
    {Errc::not_found, error::no_such_binding},
    {Errc::quota_exceeded, error::quota_exceeded},
    {Errc::isolation_violation, error::isolation_violation},
    {Errc::driver_failure, error::driver_failure},
    {Errc::unsupported, error::driver_failure},
    {Errc::journal_unavailable, error::journal_unavailable},
    {Errc::invalid_policy, error::invalid_policy},
    {Errc::flow_conflict, error::flow_conflict},
    {Errc::limits_exceeded, error::limits_exceeded},
    {Errc::out_of_resources, error::out_of_resources},
};

} // namespace

const char *error_name(Errc code) {
    for (auto &[c, name] : table)
        if (c == code) return name;
    return error::failed;
}

Errc error_code(const std::string &name) {
    for (auto &[c, n] : table)
        if (name == n) return c;
    return Errc::io;
}

} // namespace knod::bus
