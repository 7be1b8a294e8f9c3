#include "server/gateway/task_queue.h"

#include <thread>

namespace kimi::gateway {

void ElasticTaskQueue::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back(std::move(fn));
  if (idle_ < jobs_.size() && threads_ < max_threads_) {
    ++threads_;
    std::thread([this] { Work(); }).detach();  // counted in threads_; shutdown() waits for it
  }
  work_.notify_one();
}

void ElasticTaskQueue::shutdown() {
  std::unique_lock<std::mutex> lock(mu_);
  shutdown_ = true;
  work_.notify_all();
  exited_.wait(lock, [&] { return threads_ == 0; });
}

void ElasticTaskQueue::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    const bool woke = work_.wait_for(lock, idle_exit_, [&] { return !jobs_.empty() || shutdown_; });
    --idle_;
    if (jobs_.empty() && (shutdown_ || !woke)) break;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
  // The last touch of *this: shutdown() may return (and the queue be destroyed) once the lock is
  // released, and this thread touches nothing of it after that.
  if (--threads_ == 0) exited_.notify_all();
}

}  // namespace kimi::gateway
