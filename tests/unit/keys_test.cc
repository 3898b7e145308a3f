#include "daemon/keys/key_authority.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

using namespace knod;
using namespace knod::keys;
namespace fs = std::filesystem;

namespace {

KeyAuthority authority() {
    std::array<std::uint8_t, 32> secret{};
    secret.fill(7);
    return std::move(KeyAuthority::with_secret(secret)).value();
}

const Holder holder{4242, 99887766};
const Region region{64769, 12345, 0, 1 << 20};

Grant grant(Clock::time_point expires = Clock::now() + std::chrono::hours(1)) {
    return {"b1", holder, region, expires};
}

class TempDir {
  public:
    TempDir() : path_(fs::temp_directory_path() / ("knod-keys-" + std::to_string(getpid()))) {
        fs::create_directories(path_);
    }
    ~TempDir() { fs::remove_all(path_); }
    std::string file(const char *name) const { return (path_ / name).string(); }

  private:
    fs::path path_;
};

} // namespace

TEST(Keys, IssuedKeyVerifiesForItsHolderAndRegion) {
    auto ka = authority();
    auto k = ka.issue(grant());
    ASSERT_TRUE(k.ok());
    EXPECT_EQ(k->key_id.rfind("k-", 0), 0u);
    EXPECT_TRUE(ka.verify(k->key_id, k->key, holder, region).ok());
}

TEST(Keys, KeysAndIdsAreDistinct) {
    auto ka = authority();
    auto a = ka.issue(grant()).value();
    auto b = ka.issue(grant()).value();
    EXPECT_NE(a.key_id, b.key_id);
    EXPECT_NE(a.key, b.key);
    // A key's bytes do not open another key's id.
    EXPECT_EQ(ka.verify(b.key_id, a.key, holder, region).error().code, Errc::bad_key);
}

TEST(Keys, WrongHolderFailsEvenWithTheRightBytes) {
    auto ka = authority();
    auto k = ka.issue(grant()).value();
    EXPECT_EQ(ka.verify(k.key_id, k.key, {4243, holder.start_time}, region).error().code,
              Errc::wrong_holder);
    // Same pid, recycled: another start time.
    EXPECT_EQ(ka.verify(k.key_id, k.key, {holder.pid, holder.start_time + 1}, region).error().code,
              Errc::wrong_holder);
}

TEST(Keys, WrongRegionFails) {
    auto ka = authority();
    auto k = ka.issue(grant()).value();
    for (Region other :
         {Region{1, region.inode, 0, region.length}, Region{region.device, 1, 0, region.length},
          Region{region.device, region.inode, 4096, region.length},
          Region{region.device, region.inode, 0, region.length * 2}})
        EXPECT_EQ(ka.verify(k.key_id, k.key, holder, other).error().code, Errc::wrong_region);
}

TEST(Keys, ExpiredFailsAndExpiryIsFinal) {
    auto ka = authority();
    auto now = Clock::now();
    auto k = ka.issue(grant(now + std::chrono::seconds(10))).value();
    EXPECT_TRUE(ka.verify(k.key_id, k.key, holder, region, now).ok());
    EXPECT_EQ(
        ka.verify(k.key_id, k.key, holder, region, now + std::chrono::seconds(10)).error().code,
        Errc::expired);
    auto gone = ka.expire(now + std::chrono::seconds(11));
    ASSERT_EQ(gone.size(), 1u);
    EXPECT_EQ(gone[0], k.key_id);
    // Even at a time before expiry, a forgotten key never verifies again.
    EXPECT_FALSE(ka.verify(k.key_id, k.key, holder, region, now).ok());
}

TEST(Keys, RevokedFailsForever) {
    auto ka = authority();
    auto k = ka.issue(grant()).value();
    ka.revoke(k.key_id);
    EXPECT_EQ(ka.verify(k.key_id, k.key, holder, region).error().code, Errc::not_found);
    ka.revoke(k.key_id);
    EXPECT_EQ(ka.verify(k.key_id, k.key, holder, region).error().code, Errc::not_found);
}

// Revoked (and released: the daemon revokes a released binding's key) keys leave memory at
// once, not at their expiry: churn holds nothing.
TEST(Keys, RevokedKeysLeaveMemoryAtOnce) {
    auto ka = authority();
    auto far = Clock::now() + std::chrono::hours(24);
    std::vector<std::string> live;
    for (int round = 0; round < 200; ++round) {
        for (int i = 0; i < 5; ++i)
            live.push_back(ka.issue(grant(far)).value().key_id);
        EXPECT_EQ(ka.size(), live.size());
        // Revoke all but the newest two, oldest first, so the held count goes up and down.
        while (live.size() > 2) {
            ka.revoke(live.front());
            live.erase(live.begin());
        }
        EXPECT_EQ(ka.size(), 2u);
    }
    for (auto &id : live)
        ka.revoke(id);
    EXPECT_EQ(ka.size(), 0u);
    EXPECT_TRUE(ka.expire(far + std::chrono::hours(1)).empty()); // nothing was left waiting
}

TEST(Keys, TamperedBytesFail) {
    auto ka = authority();
    auto k = ka.issue(grant()).value();
    for (std::size_t i = 0; i < k.key.size(); i += 7) {
        auto bad = k.key;
        bad[i] ^= 0x01;
        EXPECT_EQ(ka.verify(k.key_id, bad, holder, region).error().code, Errc::bad_key);
    }
    std::vector<std::uint8_t> short_key(k.key.begin(), k.key.begin() + 31);
    EXPECT_EQ(ka.verify(k.key_id, short_key, holder, region).error().code, Errc::bad_key);
    EXPECT_EQ(ka.verify("k-unknown", k.key, holder, region).error().code, Errc::not_found);
}

TEST(Keys, SecretFileIsCreated0600AndReused) {
    TempDir dir;
    std::string path = dir.file("key-secret");
    auto first = KeyAuthority::open(path);
    ASSERT_TRUE(first.ok()) << first.error().message;
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_size, 32);
    auto read_all = [&] {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    std::string before = read_all();
    auto second = KeyAuthority::open(path);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(read_all(), before); // reused, not replaced
}

TEST(Keys, RefusesASecretOthersCanRead) {
    TempDir dir;
    std::string path = dir.file("key-secret");
    std::ofstream(path) << std::string(32, 'x');
    chmod(path.c_str(), 0644);
    auto ka = KeyAuthority::open(path);
    ASSERT_FALSE(ka.ok());
    EXPECT_EQ(ka.error().code, Errc::denied);
    chmod(path.c_str(), 0600);
    EXPECT_TRUE(KeyAuthority::open(path).ok());
    std::ofstream(path, std::ios::app) << "y";
    EXPECT_EQ(KeyAuthority::open(path).error().code, Errc::corrupt);
}

TEST(Keys, ACarriedKeyVerifiesInTheNextAuthorityWithTheSameSecretOnly) {
    auto before = authority();
    auto k = before.issue(grant());
    ASSERT_TRUE(k.ok());
    auto carried = before.carry(k->key_id);
    ASSERT_TRUE(carried.ok());
    // The carried state is the MAC, not the key.
    EXPECT_NE(std::vector<std::uint8_t>(carried->mac.begin(), carried->mac.end()),
              std::vector<std::uint8_t>(k->key.begin(), k->key.end()));
    auto after = authority(); // a restarted daemon: same secret, no keys yet
    EXPECT_FALSE(after.verify(k->key_id, k->key, holder, region).ok());
    ASSERT_TRUE(after.restore(k->key_id, *carried).ok());
    EXPECT_TRUE(after.verify(k->key_id, k->key, holder, region).ok());
    EXPECT_FALSE(after.restore(k->key_id, *carried).ok()) << "an id already held";
    // Another secret cannot make use of it.
    std::array<std::uint8_t, 32> other{};
    other.fill(9);
    auto stranger = std::move(KeyAuthority::with_secret(other)).value();
    ASSERT_TRUE(stranger.restore(k->key_id, *carried).ok());
    EXPECT_FALSE(stranger.verify(k->key_id, k->key, holder, region).ok());
    // A revoked key cannot be carried.
    after.revoke(k->key_id);
    EXPECT_FALSE(after.carry(k->key_id).ok());
}

// The MAC the restart handoff carries (#31): good only for the same purpose, message and
// secret; a carried key with an empty id or one holding a NUL is refused (key MACs and seals
// then never share an input).
TEST(Keys, SealsAreBoundToPurposeMessageAndSecret) {
    auto keys = authority();
    auto mac = keys.seal("handoff", "{\"a\":1}");
    EXPECT_TRUE(keys.sealed("handoff", "{\"a\":1}", mac));
    EXPECT_FALSE(keys.sealed("handoff", "{\"a\":2}", mac));
    EXPECT_FALSE(keys.sealed("other", "{\"a\":1}", mac));
    EXPECT_FALSE(keys.sealed("handoff", "{\"a\":1}", std::span(mac).first(31)));
    std::array<std::uint8_t, 32> secret{};
    secret.fill(8);
    auto other = std::move(KeyAuthority::with_secret(secret)).value();
    EXPECT_FALSE(other.sealed("handoff", "{\"a\":1}", mac));
    auto issued = keys.issue(grant()).value();
    auto carried = keys.carry(issued.key_id).value();
    EXPECT_FALSE(other.restore("", carried).ok());
    EXPECT_FALSE(other.restore(std::string("k-\0x", 4), carried).ok());
    EXPECT_TRUE(other.restore(issued.key_id, carried).ok());
}
