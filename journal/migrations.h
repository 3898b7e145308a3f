// The schema migrations, embedded from schema/*.sql at build time, in version order.
#pragma once

#include <string_view>
#include <vector>

namespace knod::journal {

struct Migration {
    int version;
    std::string_view name;
    std::string_view sql;
};

const std::vector<Migration> &migrations();

} // namespace knod::journal
