#include "daemon/driver/sim_driver.h"

#include "knod/json.h"
#include "knod/untrusted.h"

#include <nlohmann/json.hpp>

#include "daemon/driver/devmem_guards.h"
#include "daemon/driver/frame.h"
#include "host/kernel_features.h"

#include <fcntl.h>
#include <net/if.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>

namespace knod::driver {

SimDriver::SimDriver(SimConfig config, EventLoop *loop) : config_(std::move(config)), loop_(loop) {}

SimDriver::~SimDriver() {
    for (auto &[q, x] : xsks_)
        if (loop_) loop_->unwatch(x->fd());
    xsks_.clear();
    network_.reset();
}

Result<void> SimDriver::start() {
    if (!config_.datapath) return {};
    // Before anything is removed or built: a second daemon with the same sim names must leave
    // the first one's network, filter and pins alone.
    mkdir(config_.lock_dir.c_str(), 0700);
    std::string lock_path = config_.lock_dir + "/sim-" + config_.netdev + ".lock";
    auto lock = FileLock::acquire(lock_path, false);
    if (!lock) {
        if (lock.error().code == Errc::unavailable)
            return make_error(Errc::unavailable,
                              "sim netdev " + config_.netdev +
                                  " is already served by another knod-policyd (it holds " +
                                  lock_path +
                                  "); stop it, or give this one other --sim-netdev, "
                                  "--sim-netns and --bpf-pin-root names");
        return lock.error();
    }
    netdev_lock_ = std::move(*lock);
    auto path = check_kernel();
    if (!path) return path.error();
    SimNetworkConfig n;
    n.netns = config_.netns;
    n.nic = config_.netdev;
    n.wire = config_.netdev + "w";
    n.queues = config_.queues;
    n.filter.pin_root = config_.pin_root;
    n.filter.drop_unmatched = config_.drop_unmatched;
    n.filter.sim_guard = *path;
    auto net = SimNetwork::create(n);
    if (!net && config_.guard == "auto" && *path == bpf::SimGuardPath::tc &&
        net.error().message.find("knod_flow_filter_meta") != std::string::npos) {
        // The probe let the helper through but the kernel refused the program that calls it:
        // the guard moves into the filter rather than the sim going down.
        notes_.back() = "sim guard: xdp, inside the filter: the kernel refused the tc path's "
                        "filter (" +
                        net.error().message + "); steering drift is still caught";
        n.filter.sim_guard = bpf::SimGuardPath::xdp;
        net = SimNetwork::create(n);
    }
    if (!net) return net.error();
    network_ = std::move(*net);
    return {};
}

Result<bpf::SimGuardPath> SimDriver::check_kernel() {
    // Everything the data path needs but namespaces of its own (the unit forbids them; `ip`
    // makes the sim's).
    auto features = host::probe_kernel_features(false);
    const host::KernelFeature *meta = nullptr;
    for (auto &f : features) {
        if (f.id == "bpf.helper.xdp_adjust_meta") {
            meta = &f;
            continue;
        }
        bool needed = f.id == "bpf.prog.xdp" || f.id == "bpf.prog.sched_cls" ||
                      f.id == "bpf.map.lpm_trie" || f.id == "bpf.map.xskmap" ||
                      f.id == "bpf.helper.redirect_map" || f.id == "af_xdp";
        if (needed && f.probe.missing())
            return make_error(Errc::unsupported,
                              "the sim's data path needs " + f.what +
                                  ", which this kernel refuses (" + f.probe.detail + "); fix: " +
                                  f.fix + ", or run --sim-datapath=off for the control half alone");
    }
    bool meta_refused = meta && meta->probe.missing();
    std::string why = meta_refused
                          ? "this kernel refuses " + meta->what + " (" + meta->probe.detail + ")"
                          : std::string();
    if (config_.guard == "tc") {
        if (meta_refused)
            return make_error(Errc::unsupported,
                              "--sim-guard=tc needs bpf_xdp_adjust_meta in XDP programs, but " +
                                  why +
                                  "; --sim-guard=xdp (or auto) checks passed packets "
                                  "inside the filter instead");
        notes_.push_back("sim guard: tc (--sim-guard=tc)");
        return bpf::SimGuardPath::tc;
    }
    if (config_.guard == "xdp") {
        notes_.push_back("sim guard: xdp (--sim-guard=xdp)");
        return bpf::SimGuardPath::xdp;
    }
    if (meta_refused) {
        notes_.push_back("sim guard: xdp, inside the filter: " + why +
                         ", so no guard can run at tc ingress behind it; steering drift is "
                         "still caught");
        return bpf::SimGuardPath::xdp;
    }
    notes_.push_back("sim guard: tc (the kernel lets XDP hand the RX queue over in metadata)");
    return bpf::SimGuardPath::tc;
}

std::string SimDriver::datapath_note() const {
    return network_ ? network_->filter().mode_note() : std::string();
}

Result<GpuInfo> SimDriver::gpu(const std::string &name) const {
    if (name != config_.gpu)
        return make_error(Errc::invalid_argument, "gpu: no GPU named " + quote_untrusted(name) +
                                                      " (the sim has '" + config_.gpu + "')");
    return gpus().front();
}

Result<NetdevInfo> SimDriver::netdev(const std::string &name) const {
    if (name != config_.netdev)
        return make_error(Errc::invalid_argument, "netdev: no device named " +
                                                      quote_untrusted(name) + " (the sim has '" +
                                                      config_.netdev + "')");
    // Its link may have been deleted under the daemon: nothing could ever be delivered.
    if (network_ && if_nametoindex(config_.netdev.c_str()) == 0)
        return make_error(Errc::invalid_argument,
                          "netdev: " + config_.netdev +
                              " no longer exists (No such device); restart knod-policyd to "
                              "rebuild the sim network");
    return netdevs().front();
}

std::vector<GpuInfo> SimDriver::gpus() const {
    return {{config_.gpu, {config_.gpu}, config_.vram_bytes, {}}}; // simulated: no PCI address
}

std::vector<NetdevInfo> SimDriver::netdevs() const {
    return {{config_.netdev, config_.queues, {}}};
}

Result<std::vector<std::uint32_t>> SimDriver::attach(const BindingPlan &plan) {
    if (config_.queues < 2)
        return make_error(Errc::driver_failure, "netdev " + plan.netdev + " has no offload queue");
    // Queue 0 stays with the normal stack, as on a real NIC with steering rules. Bindings go to
    // the least loaded offload queue; bindings sharing a queue are told apart by their flows.
    std::uint32_t best = 1;
    for (std::uint32_t q = 2; q < config_.queues; ++q)
        if (on_queue_[q].size() < on_queue_[best].size()) best = q;
    std::uint32_t slot = 0;
    if (!free_slots_.empty()) {
        slot = *free_slots_.begin();
        free_slots_.erase(free_slots_.begin());
    } else if (next_slot_ < KNOD_MAX_BINDINGS) {
        slot = next_slot_++;
    } else {
        return make_error(Errc::driver_failure, "the flow filter's binding slots are all in use");
    }
    if (network_) {
        auto &f = network_->filter();
        Result<void> r = f.set_slot(slot, bpf::SlotState::inactive, best);
        if (r) r = f.set_flows(slot, plan.flows);
        if (!r) {
            (void)f.remove(slot);
            free_slots_.insert(slot);
            return make_error(Errc::driver_failure, r.error().message);
        }
    }
    Slot &placed = slots_[plan.id] = Slot{plan, slot, best, false, 0, 0, false, {}};
    on_queue_[best].insert(&placed);
    return std::vector<std::uint32_t>{best};
}

Result<void> SimDriver::open_queue(std::uint32_t queue) {
    if (xsks_.count(queue)) return {};
    // The kernel releases a closed AF_XDP socket's queue asynchronously, so a bind right after a
    // close (another process's, or a daemon restart) can meet EBUSY: retry a few times with a
    // short backoff. Bounded: at most ~30 ms on the loop, once per queue per daemon life,
    // because sockets stay open once made (see park_queue_if_idle).
    auto x = XskQueue::open(config_.netdev, queue, network_->filter().xsks_fd());
    for (int wait_ms = 2;
         !x && x.error().message.find(std::strerror(EBUSY)) != std::string::npos && wait_ms <= 16;
         wait_ms *= 2) {
        usleep(static_cast<useconds_t>(wait_ms) * 1000);
        x = XskQueue::open(config_.netdev, queue, network_->filter().xsks_fd());
    }
    if (!x) return x.error();
    XskQueue *raw = x->get();
    if (loop_) {
        if (auto w = loop_->watch(raw->fd(), [this, raw] { receive(*raw); }); !w) return w.error();
    }
    xsks_[queue] = std::move(*x);
    return {};
}

void SimDriver::park_queue_if_idle(std::uint32_t queue) {
    for (Slot *s : on_queue_[queue])
        if (s->active) return;
    auto it = xsks_.find(queue);
    if (it == xsks_.end()) return;
    // The socket stays open: closing it would make the next activation on this queue race the
    // kernel's asynchronous release (EBUSY). Frames already received belonged to bindings that
    // are gone; they are discarded so a later binding with the same flows never sees them.
    it->second->drain([](std::span<const std::uint8_t>) {});
}

Result<void> SimDriver::activate(const std::string &id) {
    auto it = slots_.find(id);
    if (it == slots_.end())
        return make_error(Errc::driver_failure, "binding " + id + " is not attached");
    Slot &s = it->second;
    if (network_) {
        if (auto r = open_queue(s.queue); !r) return r;
        if (auto r = network_->filter().set_slot(s.slot, bpf::SlotState::active, s.queue); !r)
            return make_error(Errc::driver_failure, r.error().message);
    }
    s.active = true;
    return {};
}

void SimDriver::detach(const std::string &id) {
    auto it = slots_.find(id);
    if (it == slots_.end()) return;
    std::uint32_t queue = it->second.queue;
    // The filter stops matching first; frames already queued find no binding and are dropped.
    if (network_) (void)network_->filter().remove(it->second.slot);
    free_slots_.insert(it->second.slot);
    on_queue_[queue].erase(&it->second);
    slots_.erase(it);
    if (network_) park_queue_if_idle(queue);
}

Result<UniqueFd> SimDriver::rx_notifier(const std::string &id) {
    auto it = slots_.find(id);
    if (it == slots_.end())
        return make_error(Errc::driver_failure, "binding " + id + " is not attached");
    // Two open files: the holder's read end cannot change the flags of the loop's write end,
    // which stays nonblocking whatever the holder does.
    int ends[2];
    if (pipe2(ends, O_CLOEXEC) != 0)
        return make_error(Errc::driver_failure,
                          std::string("cannot make a notifier pipe: ") + std::strerror(errno));
    UniqueFd theirs(ends[0]), ours(ends[1]);
    if (fcntl(ours.get(), F_SETFL, O_NONBLOCK) != 0)
        return make_error(Errc::driver_failure,
                          std::string("notifier pipe: ") + std::strerror(errno));
    it->second.notifier = std::move(ours);
    return theirs;
}

Counters SimDriver::counters(const std::string &id) const {
    auto it = slots_.find(id);
    if (it == slots_.end()) return {};
    Counters c{it->second.rx_bytes, it->second.rx_packets, 0};
    if (network_) {
        // Its own packets dropped while inactive, and foreign ones the guard dropped on its queue.
        bpf::SlotCounters f = network_->filter().counters(it->second.slot);
        c.dropped_packets = f.drops + f.misrouted;
    }
    return c;
}

std::map<std::string, std::string> SimDriver::drifted() {
    std::map<std::string, std::string> out;
    if (!network_) return out;
    // The guard charges a foreign packet to one binding of its queue (the queue's owner in its
    // index), but it landed on every binding sharing that queue: each of them drifted.
    std::map<std::uint32_t, std::uint64_t> on_queue;
    for (auto &[id, s] : slots_)
        on_queue[s.queue] += network_->filter().counters(s.slot).misrouted;
    // Asked only while a binding is active: one rtnetlink dump per tick. Only a guard at tc
    // ingress can be blinded by what runs beside it; inside the XDP filter it sees every packet
    // first.
    std::optional<std::string> blind;
    bool any_active = std::any_of(slots_.begin(), slots_.end(), [](auto &e) {
        return e.second.active && !e.second.drift_reported;
    });
    if (any_active && network_->filter().sim_guard() == bpf::SimGuardPath::tc) {
        blind = guard_blinded(config_.netdev);
        // A guard taken off the NIC (its clsact qdisc deleted) sees nothing: fail closed.
        if (!blind && !bpf::FlowFilter::guard_attached(config_.netdev))
            blind = "the guard is no longer attached to " + config_.netdev +
                    "'s tc ingress, so foreign traffic on its queues would go unseen";
    }
    for (auto &[id, s] : slots_) {
        if (!s.active || s.drift_reported) continue;
        std::uint64_t misrouted = on_queue[s.queue];
        if (misrouted)
            out[id] = misrouted_note(misrouted, s.queue, config_.netdev);
        else if (blind)
            out[id] = *blind;
        else
            continue;
        s.drift_reported = true;
    }
    return out;
}

std::optional<std::string> SimDriver::handoff(const std::string &id) const {
    auto it = slots_.find(id);
    if (it == slots_.end()) return std::nullopt;
    return knod::dump_json(
        nlohmann::json{{"rx_bytes", it->second.rx_bytes}, {"rx_packets", it->second.rx_packets}});
}

Result<std::vector<std::uint32_t>> SimDriver::readopt(const BindingPlan &plan, bool active,
                                                      const std::string &handoff,
                                                      std::map<std::string, UniqueFd>) {
    std::uint64_t rx_bytes = 0, rx_packets = 0;
    try {
        auto j = nlohmann::json::parse(handoff);
        rx_bytes = j.at("rx_bytes").get<std::uint64_t>();
        rx_packets = j.at("rx_packets").get<std::uint64_t>();
    } catch (const std::exception &e) {
        return make_error(Errc::corrupt, std::string("sim handoff: ") + e.what());
    }
    auto queues = attach(plan);
    if (!queues) return queues.error();
    Slot &s = slots_.at(plan.id);
    s.rx_bytes = rx_bytes;
    s.rx_packets = rx_packets;
    if (active)
        if (auto r = activate(plan.id); !r) {
            detach(plan.id);
            return r.error();
        }
    return queues;
}

std::map<std::string, std::uint64_t> SimDriver::stats() const {
    if (!network_) return {};
    bpf::FilterStats f = network_->filter().stats();
    return {{"unmatched_passed", f.passed},
            {"unmatched_dropped", f.dropped},
            {"malformed", f.malformed},
            {"fragments", f.fragments},
            {"delivered_packets", delivered_},
            {"binding_drops", f.binding_drops},
            {"undeliverable", undeliverable_},
            {"redecided", f.redecided},
            {"raced", f.raced},
            {"misrouted", f.misrouted}};
}

Result<void> SimDriver::set_unmatched_drop(bool drop) {
    config_.drop_unmatched = drop;
    if (!network_) return {};
    if (auto r = network_->filter().set_unmatched_drop(drop); !r)
        return make_error(Errc::driver_failure, r.error().message);
    return {};
}

void SimDriver::receive(XskQueue &q) {
    q.drain(
        [&](std::span<const std::uint8_t> frame) {
            auto parsed = parse_frame(frame);
            Slot *owner = nullptr;
            if (parsed) {
                for (Slot *s : on_queue_[q.queue()]) {
                    if (!s->active) continue;
                    bool mine = std::any_of(s->plan.flows.begin(), s->plan.flows.end(),
                                            [&](auto &f) { return f.matches(parsed->tuple); });
                    if (mine) {
                        owner = s;
                        break;
                    }
                }
            }
            if (!owner) {
                ++undeliverable_;
                return;
            }
            pending_.push_back({owner, parsed->payload});
        },
        [&] { flush_batch(); });
}

void SimDriver::flush_batch() {
    // Each binding's payloads in the order they arrived: a run of consecutive ones goes out in
    // as few pwritev calls as the ring's end allows; every holder is woken once per batch.
    std::size_t i = 0;
    while (i < pending_.size()) {
        Slot *s = pending_[i].slot;
        std::size_t j = i + 1;
        while (j < pending_.size() && pending_[j].slot == s)
            ++j;
        write_run(*s, pending_.data() + i, j - i);
        if (std::find(touched_.begin(), touched_.end(), s) == touched_.end()) touched_.push_back(s);
        i = j;
    }
    pending_.clear();
    for (Slot *s : touched_)
        notify(*s);
    touched_.clear();
}

void SimDriver::write_run(Slot &s, const Pending *run, std::size_t n) {
    constexpr std::size_t max_iov = 64;
    const std::uint64_t length = s.plan.length;
    std::size_t k = 0;
    while (k < n) {
        // The whole payloads that fit before the ring's end, contiguous in the region.
        std::uint64_t pos = s.rx_bytes % length;
        iovec iov[max_iov];
        std::size_t whole = 0;
        std::uint64_t bytes = 0;
        while (k + whole < n && whole < max_iov) {
            auto p = run[k + whole].payload;
            if (pos + bytes + p.size() > length) break;
            iov[whole] = {const_cast<std::uint8_t *>(p.data()), p.size()};
            bytes += p.size();
            ++whole;
        }
        ssize_t w = -1;
        if (whole > 0 && bytes > 0)
            w = pwritev(s.plan.region_fd, iov, static_cast<int>(whole),
                        static_cast<off_t>(s.plan.offset + pos));
        if (whole == 0 || bytes == 0 || w != static_cast<ssize_t>(bytes)) {
            // A payload across the ring's end, an empty one, or a short or failed write: one
            // at a time, as it always was (a payload only counts once all of it is written).
            if (!deliver(s, run[k].payload)) return;
            ++k;
            continue;
        }
        for (std::size_t i = 0; i < whole; ++i) {
            s.rx_bytes += run[k + i].payload.size();
            s.rx_packets += 1;
            ++delivered_;
        }
        k += whole;
    }
}

bool SimDriver::deliver(Slot &s, std::span<const std::uint8_t> payload) {
    const std::uint64_t length = s.plan.length;
    std::uint64_t pos = s.rx_bytes % length;
    std::size_t done = 0;
    while (done < payload.size()) {
        std::size_t chunk =
            static_cast<std::size_t>(std::min<std::uint64_t>(payload.size() - done, length - pos));
        ssize_t w = pwrite(s.plan.region_fd, payload.data() + done, chunk,
                           static_cast<off_t>(s.plan.offset + pos));
        if (w <= 0) return false; // the holder's memfd went bad: stop, the counters say how far
        done += static_cast<std::size_t>(w);
        pos = (pos + static_cast<std::uint64_t>(w)) % length;
    }
    s.rx_bytes += payload.size();
    s.rx_packets += 1;
    ++delivered_;
    return true;
}

void SimDriver::notify(Slot &s) {
    // Wakes the holder with the total so far. Nonblocking, 8 bytes (atomic, PIPE_BUF): a holder
    // that never reads only fills its own pipe (EAGAIN), which costs the data path nothing, and
    // loses nothing: the next record it reads carries the whole total.
    if (s.notifier.valid()) {
        std::uint64_t total = s.rx_bytes;
        (void)!write(s.notifier.get(), &total, sizeof total);
    }
}

} // namespace knod::driver
