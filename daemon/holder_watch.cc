#include "daemon/holder_watch.h"

namespace knod::daemon {

HolderWatch::HolderWatch(driver::EventLoop &loop, std::function<void(const std::string &id)> exited)
    : loop_(loop), exited_(std::move(exited)) {}

HolderWatch::~HolderWatch() {
    for (auto &[holder, watch] : holders_)
        loop_.unwatch(watch.pidfd->get());
}

void HolderWatch::add(const std::string &id, pid_t pid, std::uint64_t start_time,
                      const std::shared_ptr<UniqueFd> &pidfd) {
    Holder holder{pid, start_time};
    auto it = holders_.find(holder);
    if (it == holders_.end()) {
        if (!pidfd || !pidfd->valid()) return;
        if (!loop_.watch(pidfd->get(), [this, holder] { fired(holder); })) return;
        it = holders_.emplace(holder, Watch{pidfd, {}}).first;
    }
    it->second.bindings.insert(id);
}

void HolderWatch::remove(const std::string &id, pid_t pid, std::uint64_t start_time) {
    auto it = holders_.find({pid, start_time});
    if (it == holders_.end()) return;
    it->second.bindings.erase(id);
    if (!it->second.bindings.empty()) return;
    // Last: unwatching may destroy the callback that is running now (fired() below).
    int fd = it->second.pidfd->get();
    auto pidfd = std::move(it->second.pidfd); // the fd stays open until the loop forgot it
    holders_.erase(it);
    loop_.unwatch(fd);
}

void HolderWatch::fired(const Holder &which) {
    // Ending a binding edits the watch (and ends it with the last one, destroying the callback
    // that runs this): work on copies, never on the callback's own state.
    Holder holder = which;
    auto it = holders_.find(holder);
    if (it == holders_.end()) return;
    std::set<std::string> ids = it->second.bindings;
    auto exited = exited_;
    for (auto &id : ids)
        exited(id);
    // What the callee did not take off (it knew no such binding) goes too: an exited
    // process's pidfd stays readable, and a watch left behind would fire forever.
    if (holders_.count(holder))
        for (auto &id : ids)
            remove(id, holder.first, holder.second);
}

} // namespace knod::daemon
