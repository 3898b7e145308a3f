#include "daemon/bus/authorizer.h"

#include "daemon/bus/guard.h"

#include "daemon/bus/bus_ptr.h"
#include "protocol/names.h"

#include <grp.h>

#include <algorithm>
#include <charconv>

namespace knod::bus {

bool Authorizer::in_group(const Credentials &c, const std::string &group) const {
    if (group.empty()) return false;
    gid_t gid = 0;
    if (struct group *gr = getgrnam(group.c_str())) {
        gid = gr->gr_gid;
    } else {
        auto [end, ec] = std::from_chars(group.data(), group.data() + group.size(), gid);
        if (ec != std::errc{} || end != group.data() + group.size()) return false;
    }
    return std::find(c.gids.begin(), c.gids.end(), gid) != c.gids.end();
}

bool Authorizer::is_auditor(const Credentials &c, const policy::Settings &s) const {
    return c.uid == 0 || in_group(c, s.admin_group) || in_group(c, s.auditor_group);
}

void Authorizer::check_admin(const Credentials &c, const policy::Settings &s,
                             std::function<void(bool)> done) const {
    if (c.uid == 0 || in_group(c, s.admin_group)) return done(true);
    ask_polkit(c.sender, std::move(done));
}

namespace {

struct PolkitQuestion {
    std::function<void(bool)> done;
    bool answered = false;
};

int on_polkit_answer(sd_bus_message *reply, void *userdata, sd_bus_error *) {
    auto *q = static_cast<PolkitQuestion *>(userdata);
    int authorized = 0, challenge = 0;
    bool ok = !sd_bus_message_is_method_error(reply, nullptr) &&
              sd_bus_message_enter_container(reply, 'r', "bba{ss}") >= 0 &&
              sd_bus_message_read(reply, "bb", &authorized, &challenge) >= 0 && authorized;
    q->answered = true;
    return guarded("polkit answer", nullptr, [&] {
        q->done(ok);
        return 0;
    });
}

// The slot is floating: the bus owns it, and frees the question when the call is over,
// answered or not (a bus going away answers no).
void forget_question(void *userdata) {
    auto *q = static_cast<PolkitQuestion *>(userdata);
    if (!q->answered)
        (void)guarded("polkit question", nullptr, [&] {
            q->done(false);
            return 0;
        });
    delete q;
}

} // namespace

void Authorizer::ask_polkit(const std::string &sender, std::function<void(bool)> done) const {
    sd_bus_message *raw = nullptr;
    if (sd_bus_message_new_method_call(
            bus_, &raw, "org.freedesktop.PolicyKit1", "/org/freedesktop/PolicyKit1/Authority",
            "org.freedesktop.PolicyKit1.Authority", "CheckAuthorization") < 0)
        return done(false);
    MessagePtr call(raw);
    // Subject: the caller's bus name, which polkit resolves through the bus itself.
    if (sd_bus_message_append(call.get(), "(sa{sv})sa{ss}us", "system-bus-name", 1, "name", "s",
                              sender.c_str(), manage_action, 0, 0u, "") < 0)
        return done(false);
    auto *q = new PolkitQuestion{std::move(done)};
    sd_bus_slot *slot = nullptr;
    if (sd_bus_call_async(bus_, &slot, call.get(), on_polkit_answer, q, 5'000'000) < 0) {
        q->done(false);
        delete q;
        return;
    }
    sd_bus_slot_set_destroy_callback(slot, forget_question);
    sd_bus_slot_set_floating(slot, 1);
    sd_bus_slot_unref(slot);
}

} // namespace knod::bus
