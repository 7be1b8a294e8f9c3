#include "server/gateway/task_queue.h"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "gtest/gtest.h"

namespace kimi::gateway {
namespace {

// Jobs that each wait until `expected` of them run at once: they finish only if the queue runs
// them concurrently (httplib's own pool of max(8, cores - 1) threads would never finish 64).
TEST(ElasticTaskQueue, RunsEveryConnectionAtOnce) {
  constexpr int kJobs = 64;
  std::mutex mu;
  std::condition_variable cv;
  int running = 0, done = 0;
  {
    ElasticTaskQueue queue(/*max_threads=*/256);
    for (int i = 0; i < kJobs; ++i) {
      queue.enqueue([&] {
        std::unique_lock<std::mutex> lock(mu);
        ++running;
        cv.notify_all();
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return running == kJobs; }));
        ++done;
      });
    }
    queue.shutdown();
  }
  EXPECT_EQ(done, kJobs);
}

TEST(ElasticTaskQueue, BoundsThreadsAndReusesThem) {
  std::atomic<int> now{0}, peak{0}, done{0};
  {
    ElasticTaskQueue queue(/*max_threads=*/3);
    for (int i = 0; i < 20; ++i) {
      queue.enqueue([&] {
        const int n = ++now;
        int p = peak.load();
        while (n > p && !peak.compare_exchange_weak(p, n)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        --now;
        ++done;
      });
    }
    queue.shutdown();  // runs what is queued first
  }
  EXPECT_EQ(done.load(), 20);
  EXPECT_LE(peak.load(), 3);
}

TEST(ElasticTaskQueue, IdleThreadsExit) {
  ElasticTaskQueue queue(/*max_threads=*/4, /*idle_exit=*/std::chrono::seconds(0));
  std::atomic<int> done{0};
  for (int i = 0; i < 4; ++i) queue.enqueue([&] { ++done; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  queue.enqueue([&] { ++done; });  // a new thread starts for it
  queue.shutdown();
  EXPECT_EQ(done.load(), 5);
}

}  // namespace
}  // namespace kimi::gateway
