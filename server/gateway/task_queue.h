// The HTTP server's threads. cpp-httplib serves each connection on one task-queue thread for the
// connection's whole life (an SSE stream holds its thread until the stream ends), and its default
// pool has max(8, cores - 1) threads: a ninth concurrent stream would wait for one of the first
// eight to finish. This queue instead runs every connection at once: it starts a thread whenever no
// idle one is free, up to `max_threads` (beyond that, connections wait their turn), and lets
// threads that stay idle for a while exit.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

#include <httplib.h>

namespace kimi::gateway {

class ElasticTaskQueue : public httplib::TaskQueue {
 public:
  explicit ElasticTaskQueue(size_t max_threads,
                            std::chrono::seconds idle_exit = std::chrono::seconds(60))
      : max_threads_(max_threads), idle_exit_(idle_exit) {}
  ~ElasticTaskQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override;
  // Runs what is queued, then waits for every thread to finish.
  void shutdown() override;

 private:
  void Work();

  const size_t max_threads_;
  const std::chrono::seconds idle_exit_;
  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable exited_;
  std::deque<std::function<void()>> jobs_;
  size_t threads_ = 0;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

}  // namespace kimi::gateway
