// The MPI communicator under mpirun (-np 2 and -np 4): every collective against its definition,
// sub-communicators, and a missing peer turning into DeadlineExceeded instead of a hang.
#include <mpi.h>

#include <numeric>

#include "engine/comm/mpi_communicator.h"
#include "gtest/gtest.h"

namespace kimi {
namespace {

MpiCommunicator& World() {
  static MpiCommunicator* world = MpiCommunicator::World(std::chrono::seconds(60))->release();
  return *world;
}

TEST(MpiCommunicator, AllReduceAndAllGather) {
  MpiCommunicator& c = World();
  const int n = c.size(), r = c.rank();
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((r + 1) * (i % 7));
  ASSERT_TRUE(c.AllReduceSum(x.data(), static_cast<int64_t>(x.size())).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i], static_cast<float>(n * (n + 1) / 2 * (i % 7)));
  }
  std::vector<float> mine = {static_cast<float>(r), static_cast<float>(-r)};
  std::vector<float> all(2 * n);
  ASSERT_TRUE(c.AllGather(mine.data(), 2, all.data()).ok());
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(all[2 * k], static_cast<float>(k));
    EXPECT_EQ(all[2 * k + 1], static_cast<float>(-k));
  }
}

// Rank r sends dest+1 copies of (10 r + dest) to each dest.
TEST(MpiCommunicator, AllToAllV) {
  MpiCommunicator& c = World();
  const int n = c.size(), r = c.rank();
  std::vector<int64_t> sc(n), rc(n, r + 1);
  std::vector<float> send;
  for (int d = 0; d < n; ++d) {
    sc[d] = d + 1;
    send.insert(send.end(), d + 1, static_cast<float>(10 * r + d));
  }
  std::vector<float> recv(n * (r + 1));
  ASSERT_TRUE(c.AllToAllV(send.data(), sc, recv.data(), rc).ok());
  for (int s = 0; s < n; ++s) {
    for (int j = 0; j <= r; ++j) EXPECT_EQ(recv[s * (r + 1) + j], static_cast<float>(10 * s + r));
  }
}

TEST(MpiCommunicator, SendRecvRingAndBroadcast) {
  MpiCommunicator& c = World();
  const int n = c.size(), r = c.rank();
  int value = r * 100, got = -1;
  if (r % 2 == 0) {
    ASSERT_TRUE(c.Send(&value, sizeof value, (r + 1) % n, 7).ok());
    ASSERT_TRUE(c.Recv(&got, sizeof got, (r + n - 1) % n, 7).ok());
  } else {
    ASSERT_TRUE(c.Recv(&got, sizeof got, (r + n - 1) % n, 7).ok());
    ASSERT_TRUE(c.Send(&value, sizeof value, (r + 1) % n, 7).ok());
  }
  EXPECT_EQ(got, ((r + n - 1) % n) * 100);
  char msg[32] = {};
  if (r == n - 1) std::snprintf(msg, sizeof msg, "from %d", r);
  ASSERT_TRUE(c.Broadcast(msg, sizeof msg, n - 1).ok());
  EXPECT_EQ(std::string(msg), "from " + std::to_string(n - 1));
}

TEST(MpiCommunicator, SplitGroups) {
  MpiCommunicator& c = World();
  auto half = c.Split(c.rank() % 2, c.rank());
  ASSERT_TRUE(half.ok());
  float v = 1.0f;
  ASSERT_TRUE((*half)->AllReduceSum(&v, 1).ok());
  EXPECT_EQ(v, static_cast<float>((*half)->size()));
  EXPECT_EQ((*half)->rank(), c.rank() / 2);
}

// A peer that never answers: the wait ends with an error naming the operation and the peer.
TEST(MpiCommunicator, MissingPeerIsADeadlineNotAHang) {
  MpiCommunicator& world = World();
  auto c = world.Split(0, world.rank());  // same group, 1 s timeout below
  ASSERT_TRUE(c.ok());
  auto quick = MpiCommunicator::World(std::chrono::seconds(1));
  ASSERT_TRUE(quick.ok());
  if (world.rank() == 0) {
    int x = 0;
    const absl::Status s = (*quick)->Recv(&x, sizeof x, 1, 99);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("rank 0: recv with rank 1"), std::string::npos) << s;
  }
  ASSERT_TRUE(world.Barrier().ok());
}

}  // namespace
}  // namespace kimi

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kimi::World();
  // Only rank 0 prints the gtest report; every rank's failures still set the exit code.
  if (kimi::World().rank() != 0) {
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  }
  return RUN_ALL_TESTS();
}
