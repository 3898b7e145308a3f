#include "cli/caller_lookup.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

namespace knod::cli {
namespace {

std::optional<std::uint32_t> number(const std::string &s) {
    std::uint32_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
    return v;
}

void set_groups(policy::Caller &c, std::vector<gid_t> gids) {
    std::sort(gids.begin(), gids.end());
    gids.erase(std::unique(gids.begin(), gids.end()), gids.end());
    c.gids.clear();
    c.group_names.clear();
    for (gid_t g : gids) {
        c.gids.push_back(g);
        if (struct group *gr = getgrgid(g)) c.group_names.emplace_back(gr->gr_name);
    }
}

} // namespace

const char *to_string(GroupsSource s) {
    switch (s) {
    case GroupsSource::given:
        return "given (--group)";
    case GroupsSource::this_process:
        return "this process (getgroups)";
    case GroupsSource::user_database:
        return "the user database (NSS), as a stand-in: the daemon uses the calling process's "
               "own groups; pass --group to state them";
    }
    return "?";
}

Invoker invoking_user() {
    if (geteuid() == 0)
        if (const char *sudo = std::getenv("SUDO_UID"); sudo && number(sudo))
            return {sudo, "you (SUDO_UID, under sudo)"};
    return {std::to_string(getuid()), "you"};
}

Result<policy::Caller> lookup_caller(const std::string &who) {
    policy::Caller c;
    auto uid = number(who);
    struct passwd *pw = uid ? getpwuid(*uid) : getpwnam(who.c_str());
    if (!pw && !uid) return make_error(Errc::not_found, "no such user '" + who + "'");
    if (!pw) {
        c.uid = *uid; // a uid without a name still matches numeric rules
        return c;
    }
    c.uid = pw->pw_uid;
    c.user = pw->pw_name;
    return c;
}

Result<GroupsSource> fill_groups(policy::Caller &c, const std::vector<std::string> &given) {
    std::vector<gid_t> gids;
    if (!given.empty()) {
        for (auto &g : given) {
            if (auto n = number(g)) {
                gids.push_back(*n);
            } else if (struct group *gr = getgrnam(g.c_str())) {
                gids.push_back(gr->gr_gid);
            } else {
                return make_error(Errc::not_found, "no such group '" + g + "'");
            }
        }
        set_groups(c, std::move(gids));
        return GroupsSource::given;
    }
    if (c.uid == geteuid()) {
        int n = getgroups(0, nullptr);
        if (n < 0) return make_error(Errc::io, "getgroups failed");
        gids.resize(static_cast<std::size_t>(n));
        n = getgroups(n, gids.data());
        if (n < 0) return make_error(Errc::io, "getgroups failed");
        gids.resize(static_cast<std::size_t>(n));
        gids.push_back(getegid());
        set_groups(c, std::move(gids));
        return GroupsSource::this_process;
    }
    if (struct passwd *pw = getpwuid(c.uid)) {
        int n = 64;
        gids.resize(static_cast<std::size_t>(n));
        while (getgrouplist(pw->pw_name, pw->pw_gid, gids.data(), &n) < 0)
            gids.resize(static_cast<std::size_t>(n));
        gids.resize(static_cast<std::size_t>(n));
    }
    set_groups(c, std::move(gids));
    return GroupsSource::user_database;
}

} // namespace knod::cli
