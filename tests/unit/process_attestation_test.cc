// A socketpair end as proof of the process that made it (daemon/process_attestation.h), on this
// test's own processes and the running kernel.
#include "daemon/peer.h"
#include "daemon/process_attestation.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

using knod::Errc;
using knod::UniqueFd;
using knod::daemon::attest_socketpair_end;
using knod::daemon::pidfd_pid;

namespace {

struct Pair {
    UniqueFd a, b;
};

Pair socketpair_here() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

// A one-byte message with room for one fd (SCM_RIGHTS), as the bus carries a method's 'h'
// argument.
struct FdMessage {
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{nullptr, 0, &iov, 1, control, sizeof control, 0};
    FdMessage(const FdMessage &) = delete; // msg points into this object
    FdMessage() = default;
};

void send_fd(int over, int fd) {
    FdMessage m;
    cmsghdr *c = CMSG_FIRSTHDR(&m.msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    (void)::sendmsg(over, &m.msg, 0);
}

int receive_fd(int over) {
    FdMessage m;
    if (::recvmsg(over, &m.msg, MSG_CMSG_CLOEXEC) != 1) return -1;
    cmsghdr *c = CMSG_FIRSTHDR(&m.msg);
    if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd = -1;
    std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

// Skips on a kernel that cannot pin a socket's maker (SO_PEERPIDFD, Linux 6.5).
#define SKIP_WITHOUT_PEERPIDFD(result)                                                             \
    if (!(result) && (result).error().code == Errc::unsupported)                                   \
    GTEST_SKIP() << (result).error().message

} // namespace

TEST(ProcessAttestation, ASocketpairOfTheCallerNamesItsLiveProcess) {
    Pair p = socketpair_here();
    auto a = attest_socketpair_end(p.b.get(), geteuid(), getpid());
    SKIP_WITHOUT_PEERPIDFD(a);
    ASSERT_TRUE(a) << a.error().message;
    EXPECT_EQ(a->pid, getpid());
    EXPECT_EQ(a->uid, geteuid());
    EXPECT_EQ(a->gid, getegid());
    auto pid = pidfd_pid(a->pidfd.get());
    ASSERT_TRUE(pid) << pid.error().message;
    EXPECT_EQ(*pid, getpid());
}

TEST(ProcessAttestation, AnotherPidOrUidThanTheBussIsRefused) {
    Pair p = socketpair_here();
    auto other_pid = attest_socketpair_end(p.b.get(), geteuid(), getpid() + 1);
    SKIP_WITHOUT_PEERPIDFD(other_pid);
    ASSERT_FALSE(other_pid);
    EXPECT_EQ(other_pid.error().code, Errc::denied);
    EXPECT_NE(other_pid.error().message.find("not by the caller"), std::string::npos);
    auto other_uid = attest_socketpair_end(p.b.get(), geteuid() + 1, getpid());
    ASSERT_FALSE(other_uid);
    EXPECT_EQ(other_uid.error().code, Errc::denied);
}

// The recycled-pid attack's shape: a process made the pair, handed an end on and exited. The
// end still names it (not whoever holds the end, not whoever has its pid now).
TEST(ProcessAttestation, APairWhoseMakerExitedProvesNothing) {
    Pair chan = socketpair_here();
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        int sv[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) ::_exit(1);
        send_fd(chan.b.get(), sv[1]);
        ::_exit(0);
    }
    UniqueFd end(receive_fd(chan.a.get()));
    ASSERT_TRUE(end.valid());
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child); // reaped: its pid may be anyone's now
    auto as_maker = attest_socketpair_end(end.get(), geteuid(), child);
    SKIP_WITHOUT_PEERPIDFD(as_maker);
    ASSERT_FALSE(as_maker);
    EXPECT_NE(as_maker.error().message.find("exited"), std::string::npos)
        << as_maker.error().message;
    auto as_holder = attest_socketpair_end(end.get(), geteuid(), getpid());
    ASSERT_FALSE(as_holder);
    EXPECT_EQ(as_holder.error().code, Errc::denied);
}

// An accepted connection's peer credentials name whichever process connected: not a proof.
TEST(ProcessAttestation, ASocketWithAnAddressIsRefused) {
    UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::string name = "knod-attest-test-" + std::to_string(getpid());
    std::memcpy(addr.sun_path + 1, name.data(), name.size()); // abstract: nothing to clean up
    socklen_t len = static_cast<socklen_t>(sizeof(sa_family_t) + 1 + name.size());
    ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr *>(&addr), len), 0);
    ASSERT_EQ(::listen(listener.get(), 1), 0);
    UniqueFd client(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(::connect(client.get(), reinterpret_cast<sockaddr *>(&addr), len), 0);
    UniqueFd accepted(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(accepted.valid());
    for (int fd : {client.get(), accepted.get()}) {
        auto a = attest_socketpair_end(fd, geteuid(), getpid());
        ASSERT_FALSE(a);
        EXPECT_EQ(a.error().code, Errc::denied);
        EXPECT_NE(a.error().message.find("socketpair"), std::string::npos) << a.error().message;
    }
    int pipefd[2];
    ASSERT_EQ(::pipe(pipefd), 0);
    UniqueFd r(pipefd[0]), w(pipefd[1]);
    auto not_socket = attest_socketpair_end(r.get(), geteuid(), getpid());
    ASSERT_FALSE(not_socket);
    EXPECT_EQ(not_socket.error().code, Errc::denied);
}

TEST(ProcessAttestation, APidfdSaysItsProcessUntilItExits) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::pause();
        ::_exit(0);
    }
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, child, 0)));
    ASSERT_TRUE(pidfd.valid());
    auto live = pidfd_pid(pidfd.get());
    ASSERT_TRUE(live) << live.error().message;
    EXPECT_EQ(*live, child);
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    auto gone = pidfd_pid(pidfd.get());
    ASSERT_FALSE(gone);
    EXPECT_EQ(gone.error().code, Errc::not_found);
}

// identify_peer with a proven process: read through that process while it runs at the bus's
// pid; refused once it exited (a connection speaks only for the process that proved itself on
// it), and refused for another pid. Unproven, the pid alone vouches for no group.
TEST(ProcessAttestation, AProvenConnectionSpeaksOnlyWhileItsProcessRuns) {
    using knod::daemon::identify_peer;
    using knod::daemon::ProcessProof;
    int ready[2];
    ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
    pid_t child = ::fork();
    if (child == 0) {
        (void)!::write(ready[1], "r", 1);
        for (;;)
            ::pause();
    }
    ::close(ready[1]);
    char c;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    knod::daemon::ProvenProcess proven{
        std::make_shared<UniqueFd>(static_cast<int>(::syscall(SYS_pidfd_open, child, 0))),
        ProcessProof::attested, child};
    ASSERT_TRUE(proven.pidfd->valid());
    auto peer = identify_peer(::geteuid(), child, std::nullopt, ":1.7", proven);
    ASSERT_TRUE(peer) << peer.error().message;
    EXPECT_EQ(peer->process_proof, ProcessProof::attested);
    EXPECT_TRUE(peer->caller().process_proven);
    EXPECT_FALSE(peer->gids.empty()) << "a proven process's own groups";
    auto other = identify_peer(::geteuid(), ::getpid(), std::nullopt, ":1.7", proven);
    EXPECT_FALSE(other) << "the proven process is not the one at the bus's pid";
    auto unproven = identify_peer(::geteuid(), child, std::nullopt, ":1.7");
    ASSERT_TRUE(unproven) << unproven.error().message;
    EXPECT_EQ(unproven->process_proof, ProcessProof::pid_only);
    EXPECT_FALSE(unproven->caller().process_proven);
    EXPECT_TRUE(unproven->gids.empty()) << "no bus groups and a pid alone: no group at all";
    auto with_bus_groups = identify_peer(::geteuid(), child, std::vector<gid_t>{4242}, ":1.7");
    ASSERT_TRUE(with_bus_groups);
    EXPECT_EQ(with_bus_groups->gids, std::vector<gid_t>{4242}) << "the bus's groups only";
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    auto gone = identify_peer(::geteuid(), child, std::nullopt, ":1.7", proven);
    ASSERT_FALSE(gone);
    EXPECT_EQ(gone.error().code, Errc::denied);
    EXPECT_NE(gone.error().message.find("has exited"), std::string::npos) << gone.error().message;
}

TEST(ProcessAttestation, ProofsReadBackAsTheWeakestWhenUnknown) {
    using knod::daemon::parse_process_proof;
    using knod::daemon::ProcessProof;
    for (ProcessProof p : {ProcessProof::pid_only, ProcessProof::attested, ProcessProof::bus_pidfd})
        EXPECT_EQ(parse_process_proof(knod::daemon::to_string(p)), p);
    for (const char *t : {"", "ATTESTED", "bus-pidfd ", "proven", "attested\n"})
        EXPECT_EQ(parse_process_proof(t), ProcessProof::pid_only) << t;
}
