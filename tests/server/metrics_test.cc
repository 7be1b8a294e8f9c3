#include "server/metrics.h"

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "gtest/gtest.h"

namespace kimi::server {
namespace {

TEST(Metrics, ExposesTheDocumentedFamilies) {
  auto m = Metrics::Start("127.0.0.1:0", "test-model");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT((*m)->port(), 0);
  (*m)->OnFinished(sched::FinishReason::kStop, 10, 5, 0.5);
  (*m)->OnFirstToken(0.05, 0.01);
  sched::SchedulerStats s;
  s.slots_total = 8;
  s.slots_used = 3;
  s.preempt_swap = 2;
  (*m)->SetPools(s);
  const std::string text = (*m)->Scrape();
  for (const char* needle :
       {"kimi_requests_total{finish_reason=\"stop\"} 1", "kimi_prompt_tokens_total 10",
        "kimi_generation_tokens_total 5", "kimi_kda_state_slots{state=\"used\"} 3",
        "kimi_preemptions_total{kind=\"swap\"} 2", "kimi_time_to_first_token_seconds_bucket",
        "kimi_build_info{model=\"test-model\",version=\"0.1.0\"} 1"}) {
    EXPECT_NE(text.find(needle), std::string::npos) << needle << "\n" << text;
  }
}

// Every kimi_ series the Grafana dashboard queries is exported.
TEST(Metrics, DashboardQueriesExist) {
  const char* src = std::getenv("KIMI_SOURCE_DIR");
  std::ifstream in(std::string(src ? src : ".") + "/deploy/grafana/kimi-serve.json");
  ASSERT_TRUE(in) << "deploy/grafana/kimi-serve.json missing";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string dash = ss.str();
  auto m = Metrics::Start("127.0.0.1:0", "m");
  ASSERT_TRUE(m.ok());
  sched::StepStats step;  // one step with a MoE layer, as any MoE model produces
  step.batch_size = 1;
  step.moe.push_back(MoeLayerStats{1, 4, 2.0, 1.5, 1.2, 1});
  (*m)->OnStep(step, sched::SchedulerStats{});
  const std::string scrape = (*m)->Scrape();
  std::set<std::string> names;
  const std::regex word("kimi_[a-z0-9_]+");
  for (auto it = std::sregex_iterator(dash.begin(), dash.end(), word); it != std::sregex_iterator();
       ++it) {
    names.insert(it->str());
  }
  ASSERT_GT(names.size(), 10u);
  for (const std::string& n : names) {
    EXPECT_NE(scrape.find("\n" + n), std::string::npos) << n << " is queried but not exported";
  }
}

}  // namespace
}  // namespace kimi::server
