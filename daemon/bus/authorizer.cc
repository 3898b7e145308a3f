#include "daemon/bus/authorizer.h"

#include "daemon/bus/guard.h"

#include "daemon/bus/bus_ptr.h"
#include "protocol/names.h"

#include <grp.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <iostream>

namespace knod::bus {

Authorizer::Authorizer(sd_bus *bus, std::size_t per_uid, std::size_t total)
    : bus_(bus), per_uid_(per_uid), total_(total) {}

Authorizer::~Authorizer() {
    in_flight_->alive = false;
}

std::uint64_t Authorizer::failed_questions() const {
    return in_flight_->failed;
}

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
    if (c.contained) return false;
    return c.host_root || in_group(c, s.admin_group) || in_group(c, s.auditor_group);
}

Result<void> Authorizer::check_admin(const Credentials &c, const policy::Settings &s,
                                     std::function<void(bool)> done) const {
    if (c.contained) {
        done(false); // polkit is not asked: it would take a container's root for the host's
        return {};
    }
    if (c.host_root || in_group(c, s.admin_group)) {
        done(true);
        return {};
    }
    if (c.uid == 0) {
        // Root whose process is not proven: polkit would say yes to any uid 0, and the process
        // at the bus's pid may not be the one that connected (a container's, since exited).
        done(false);
        return {};
    }
    auto &f = *in_flight_;
    if (auto it = f.per_uid.find(c.principal); it != f.per_uid.end() && it->second >= per_uid_)
        return make_error(Errc::limits_exceeded,
                          "at most " + std::to_string(per_uid_) +
                              " polkit questions in flight per user; wait for the answers");
    if (f.total >= total_)
        return make_error(Errc::limits_exceeded, "at most " + std::to_string(total_) +
                                                     " polkit questions in flight in all");
    ask_polkit(c, std::move(done));
    return {};
}

namespace {

struct PolkitQuestion {
    std::function<void(bool)> done;
    std::shared_ptr<Authorizer::InFlight> in_flight;
    daemon::PrincipalKey who;
    bool answered = false;
    ~PolkitQuestion() {
        in_flight->total -= 1;
        if (auto it = in_flight->per_uid.find(who); it != in_flight->per_uid.end())
            if (--it->second == 0) in_flight->per_uid.erase(it);
    }
};

int on_polkit_answer(sd_bus_message *reply, void *userdata, sd_bus_error *) {
    auto *q = static_cast<PolkitQuestion *>(userdata);
    int authorized = 0, challenge = 0;
    if (const sd_bus_error *e = sd_bus_message_get_error(reply)) {
        // Polkit's own "no", or the bus refusing the call: either way no, logged and counted.
        q->in_flight->failed += 1;
        std::cerr << "knod-policyd: polkit question failed (" << q->in_flight->failed
                  << " so far): " << escape_untrusted(e->name ? e->name : "", Escape::message, 128)
                  << std::endl;
    }
    bool ok = !sd_bus_message_is_method_error(reply, nullptr) &&
              sd_bus_message_enter_container(reply, 'r', "bba{ss}") >= 0 &&
              sd_bus_message_read(reply, "bb", &authorized, &challenge) >= 0 && authorized;
    q->answered = true;
    if (!q->in_flight->alive) return 0;
    return guarded("polkit answer", nullptr, [&] {
        q->done(ok);
        return 0;
    });
}

// The slot is floating: the bus owns it, and frees the question when the call is over,
// answered or not (a bus going away answers no).
void forget_question(void *userdata) {
    auto *q = static_cast<PolkitQuestion *>(userdata);
    if (!q->answered && q->in_flight->alive)
        (void)guarded("polkit question", nullptr, [&] {
            q->done(false);
            return 0;
        });
    delete q;
}

} // namespace

void Authorizer::ask_polkit(const Credentials &c, std::function<void(bool)> done) const {
    const std::string &sender = c.sender;
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
    in_flight_->total += 1;
    in_flight_->per_uid[c.principal] += 1;
    auto *q = new PolkitQuestion{std::move(done), in_flight_, c.principal};
    sd_bus_slot *slot = nullptr;
    if (int r = sd_bus_call_async(bus_, &slot, call.get(), on_polkit_answer, q, 5'000'000); r < 0) {
        in_flight_->failed += 1;
        std::cerr << "knod-policyd: cannot ask polkit (" << in_flight_->failed
                  << " failures so far): " << std::strerror(-r) << std::endl;
        auto answer = std::move(q->done);
        delete q;
        answer(false);
        return;
    }
    sd_bus_slot_set_destroy_callback(slot, forget_question);
    sd_bus_slot_set_floating(slot, 1);
    sd_bus_slot_unref(slot);
}

} // namespace knod::bus
