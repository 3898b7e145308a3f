#include "cli/caller_lookup.h"

#include <grp.h>
#include <pwd.h>

#include <charconv>

namespace knod::cli {

Result<policy::Caller> lookup_caller(const std::string &who) {
    policy::Caller c;
    std::uint32_t uid = 0;
    auto [end, ec] = std::from_chars(who.data(), who.data() + who.size(), uid);
    bool numeric = ec == std::errc{} && end == who.data() + who.size();
    struct passwd *pw = numeric ? getpwuid(uid) : getpwnam(who.c_str());
    if (!pw && !numeric) return make_error(Errc::not_found, "no such user '" + who + "'");
    if (!pw) {
        c.uid = uid; // a uid without a name still matches numeric rules
        return c;
    }
    c.uid = pw->pw_uid;
    c.user = pw->pw_name;
    int n = 64;
    std::vector<gid_t> gids(static_cast<std::size_t>(n));
    while (getgrouplist(pw->pw_name, pw->pw_gid, gids.data(), &n) < 0)
        gids.resize(static_cast<std::size_t>(n));
    gids.resize(static_cast<std::size_t>(n));
    for (gid_t g : gids) {
        c.gids.push_back(g);
        if (struct group *gr = getgrgid(g)) c.group_names.emplace_back(gr->gr_name);
    }
    return c;
}

} // namespace knod::cli
