// kimi-server: loads a checkpoint and serves kimi.v1.Generation over gRPC, with health, reflection
// and Prometheus metrics. Start-up order: listen first (health NOT_SERVING, requests UNAVAILABLE),
// load the model, run a warm-up step, then report SERVING. SIGTERM/SIGINT drain and exit 0; a
// second one cuts the drain short, and one before SERVING ends the process at once.
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/comm/mpi_communicator.h"
#include "engine/distributed.h"
#include "kernels/cpu/cpu_budget.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include <signal.h>
#ifdef KIMI_HAVE_CUDA
#include "engine/cuda/cuda_step_runner.h"
#endif
#include "server/backend.h"
#include "server/generation_service.h"
#include "server/text_stream.h"
#include "server/tls.h"

namespace kimi::server {
namespace {

// The server's credentials. The TLS files are checked here, before gRPC sees them: gRPC reports
// a bad certificate or key only as a failure to listen ("address in use or invalid").
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerConfig& c) {
  if (c.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  auto tls = ReadTlsFiles(c);
  if (!tls.ok()) return tls.status();
  std::vector<std::string> warnings;
  if (absl::Status s = CheckTlsMaterial(*tls, &warnings); !s.ok()) return s;
  for (const std::string& w : warnings) spdlog::warn("{}", w);
  grpc::SslServerCredentialsOptions opts;
  opts.pem_key_cert_pairs.push_back({tls->private_key, tls->cert_chain});
  if (!tls->client_ca.empty()) {
    opts.pem_root_certs = tls->client_ca;
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

EngineOptions EngineOptionsOf(const ServerConfig& c) {
  EngineOptions o;
  o.activation = c.activation_dtype == "bf16" ? cpu::ActivationDtype::kBf16
                                              : cpu::ActivationDtype::kF32;
  return o;
}

KdaStateDtype KdaStateDtypeOf(const ServerConfig& c) {
  KdaStateDtype dtype = KdaStateDtype::kF32;
  ParseKdaStateDtype(c.kda_state_dtype, &dtype);  // validated: fp32 or bf16
  return dtype;
}

// Sizes the state pools from the memory budgets (each pool its own capacity).
// Every rank sizes its pools alike, by the largest share any stage holds (its KDA state a request,
// its MLA cache a token): the leader's pool sizes are every rank's. Sized by its own stage, a
// rank whose stage had no MLA layer took a page for a byte (a billion pages, 8 GB for k3-tiny's
// page table, 15-23 s to start), and ranks disagreed on the count (a follower's page out of its
// cache ended the job).
sched::SchedulerConfig Pools(const ServerConfig& c, const Model& model) {
  int64_t slot_bytes = 1, token_bytes = 1;
  const ParallelLayout& layout = model.shard().layout;
  for (int stage = 0; stage < layout.pp; ++stage) {
    const ModelConfig m = ShardConfig(
        model.full_config(), Shard::For(model.full_config(), layout, stage * layout.group()));
    slot_bytes = std::max(slot_bytes, KdaStatePool::SlotBytes(m));
    token_bytes = std::max(token_bytes, MlaKvCache::BytesPerToken(m));
  }
  sched::SchedulerConfig s;
  s.max_running = std::max<int64_t>(1, std::min(c.max_running, (c.kda_state_mib << 20) / slot_bytes));
  const int64_t page_bytes = token_bytes * c.page_size;
  s.num_pages = std::max<int64_t>(1, (c.kv_cache_mib << 20) / page_bytes);
  s.page_size = c.page_size;
  s.token_budget = c.token_budget;
  s.max_waiting = c.max_waiting;
  s.prefix_interval = c.prefix_cache_mib > 0 ? c.prefix_interval : 0;
  s.prefix_cache_bytes = c.prefix_cache_mib << 20;
  s.preempt = c.preemption == "recompute" ? sched::PreemptPolicy(sched::Recompute{})
                                          : sched::PreemptPolicy(sched::SwapToHost{});
  return s;
}

// The start-up error when the state pools cannot be allocated, naming the settings that size them.
std::string PoolsTooLarge(const ServerConfig& c, const sched::SchedulerConfig& pools) {
  return absl::StrCat("cannot allocate the state pools (", pools.max_running,
                      " KDA state slots from memory.kda_state_mib ", c.kda_state_mib, ", ",
                      pools.num_pages, " KV pages of ", pools.page_size,
                      " tokens from memory.kv_cache_mib ", c.kv_cache_mib,
                      ", an AttnRes cache for batching.token_budget ", c.token_budget,
                      " tokens): out of memory; lower these settings");
}

// One request through the whole path before reporting SERVING.
absl::Status WarmUp(Backend& b) {
  struct Wait : sched::RequestSink {
    explicit Wait(std::atomic<bool>* ended) : ended(ended) {}
    std::atomic<bool>* ended;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    sched::StreamEvent last;
    void OnEvent(sched::StreamEvent e) override {  // on the engine thread
      std::lock_guard<std::mutex> lock(mu);
      if (e.finish != sched::FinishReason::kNone) {
        *ended = true;
        done = true;
        last = std::move(e);
        cv.notify_all();
      }
    }
  };
  auto sink = std::make_shared<Wait>(&b.warmed_up);
  sched::RequestSpec spec;
  spec.id = "warmup";
  spec.prompt = {0};
  spec.max_tokens = 2;
  spec.sampling.temperature = 0.0f;
  if (absl::Status s = b.loop->Submit(spec, {}, sink); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(sink->mu);
  if (!sink->cv.wait_for(lock, std::chrono::minutes(10), [&] { return sink->done; })) {
    return absl::DeadlineExceededError("warm-up step did not finish in 10 minutes");
  }
  if (sink->last.finish == sched::FinishReason::kError) {
    return absl::InternalError("warm-up failed: " + sink->last.detail);
  }
  return absl::OkStatus();
}

// Ranks of a sharded model (mpirun): the communicators and this rank's place.
struct Cluster {
  ParallelLayout layout;
  std::unique_ptr<MpiCommunicator> world, stage;
  int rank() const { return world ? world->rank() : 0; }
  EngineComms comms() const { return {stage.get(), world.get()}; }
};

absl::StatusOr<Cluster> JoinCluster(const ServerConfig& c) {
  Cluster cl;
  cl.layout.tp = static_cast<int>(c.tp);
  cl.layout.ep = static_cast<int>(c.ep);
  cl.layout.pp = static_cast<int>(c.pp);
  cl.layout.replicate_threshold = c.replicate_threshold;
  cl.layout.max_replicated_experts = static_cast<int>(c.max_replicated_experts);
  for (absl::string_view part : absl::StrSplit(c.stage_layers, ',', absl::SkipEmpty())) {
    int64_t n;
    if (!absl::SimpleAtoi(part, &n)) {
      return absl::InvalidArgumentError("parallel.stage_layers: comma-separated integers");
    }
    cl.layout.stage_layers.push_back(n);
  }
  if (!MpiCommunicator::LaunchedWithMpi()) {
    if (cl.layout.single()) return cl;
    // Checked before MPI starts: a singleton MPI job would end in MPI_ABORT's banner instead.
    return absl::InvalidArgumentError(
        absl::StrCat("parallel: tp ", c.tp, ", ep ", c.ep, ", pp ", c.pp, " need ",
                     cl.layout.world(), " ranks (pp x max(tp, ep)): start them with mpirun -np ",
                     cl.layout.world(), " kimi-server ... (the same command line on every rank)"));
  }
  auto world = MpiCommunicator::World(std::chrono::seconds(c.collective_timeout_seconds));
  if (!world.ok()) return world.status();
  cl.world = std::move(*world);
  if (cl.world->size() != cl.layout.world()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel: tp ", c.tp, ", ep ", c.ep, ", pp ", c.pp, " need ", cl.layout.world(),
        " ranks (pp x max(tp, ep)); mpirun started ", cl.world->size()));
  }
  const int g = cl.layout.group();
  auto stage = cl.world->Split(cl.world->rank() / g, cl.world->rank() % g);
  if (!stage.ok()) return stage.status();
  cl.stage = std::move(*stage);
  return cl;
}

// The engine's threads and the CPUs they were sized by ($KIMI_NUM_THREADS / --threads override;
// more threads than CPUs is allowed, with a warning: its spinning workers take turns).
void LogThreads() {
  const int threads = cpu::ThreadPool::Global().num_threads();
  const cpu::CpuBudget budget = cpu::ProcessCpuBudget();
  spdlog::info("engine threads: {}; this process may use {}; CPU kernels: {} ($KIMI_ISA)", threads,
               cpu::DescribeCpuBudget(budget), cpu::IsaName(cpu::MatMulIsa()));
  if (threads > budget.usable()) {
    spdlog::warn(
        "{} engine threads for {} usable CPU{}: they will take turns and wait on each "
        "other (model.threads / --threads 0 sizes the pool to the CPUs)",
        threads, budget.usable(), budget.usable() == 1 ? "" : "s");
  }
}

// How this process loads its piece of the model. Under mpirun each rank maps the files (only its
// shard's pages are touched) and copies its own matrices out (Model::Options::copy_shard); ranks
// other than 0 prefix their load lines with their number.
Model::Options LoadOptions(const Cluster& cl) {
  Model::Options opts;
  opts.layout = cl.layout;
  opts.rank = cl.rank();
  if (cl.world) {
    opts.memory = WeightMemory::kMap;
    opts.copy_shard = true;
  }
  opts.log = [rank = cl.rank()](const std::string& line) {
    if (rank == 0) {
      spdlog::info("load: {}", line);
    } else {
      spdlog::info("rank {}: load: {}", rank, line);
    }
  };
  return opts;
}

// Every rank but 0: load this rank's shard and follow rank 0's steps until it says stop.
int Follow(const ServerConfig& c, Cluster& cl) {
  auto model = Model::Load(c.model_path, LoadOptions(cl));
  if (!model.ok()) {
    MpiCommunicator::Abort(absl::StrCat("rank ", cl.rank(), ": cannot load model: ",
                                        model.status().message()));
  }
  spdlog::info("{} (pid {})", (*model)->shard().Describe(), getpid());
  LogThreads();
  (*model)->SetKdaStateDtype(KdaStateDtypeOf(c));
  const sched::SchedulerConfig pools = Pools(c, **model);
  DistributedOptions d;
  d.slots = pools.max_running;
  d.pages = pools.num_pages;
  d.page_size = pools.page_size;
  d.follower_patience = std::chrono::seconds(c.collective_timeout_seconds);
  d.engine = EngineOptionsOf(c);
  absl::Status s;
  try {  // the follower allocates its pools here (as rank 0 does in EngineLoop)
    s = FollowerLoop(**model, cl.comms(), d);
  } catch (const std::bad_alloc&) {
    s = absl::ResourceExhaustedError(
        absl::StrCat("rank ", cl.rank(), ": ", PoolsTooLarge(c, pools)));
  } catch (const std::length_error&) {
    s = absl::ResourceExhaustedError(
        absl::StrCat("rank ", cl.rank(), ": ", PoolsTooLarge(c, pools)));
  }
  if (!s.ok()) MpiCommunicator::Abort(std::string(s.message()));
  spdlog::info("rank {}: stopped", cl.rank());
  return 0;
}

constexpr timespec kSignalPoll{0, 50'000'000};

// Lets running streams finish for up to `drain`, then ends the rest as cancelled. A second
// SIGTERM/SIGINT ends them at once, as kimi-gateway's does: the operator who sends it does not
// want to wait out server.drain_timeout_seconds.
void Drain(sched::EngineLoop& loop, const sigset_t& signals, std::chrono::milliseconds drain) {
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    loop.Shutdown(drain);
    drained = true;
  });
  while (!drained.load()) {
    if (const int sig = sigtimedwait(&signals, nullptr, &kSignalPoll); sig > 0) {
      spdlog::info("{} again: cancelling the streams still running", strsignal(sig));
      loop.Shutdown(std::chrono::milliseconds(0));  // shortens the drain; returns once it ended
      break;
    }
  }
  drainer.join();
}

int Run(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--print-example-config") {
    std::fputs(ExampleYaml().c_str(), stdout);  // deploy/config/example.yaml
    return 0;
  }
  // --check-config: parse and validate the configuration (file and flags), then exit.
  bool check_only = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::string(argv[i]) == "--check-config") {
      check_only = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  argc = static_cast<int>(args.size());
  argv = args.data();
  bool help = false;
  auto parsed = ParseCommandLine(argc, argv, &help);
  if (help) {
    std::fputs(HelpText().c_str(), stdout);
    return 0;
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "kimi-server: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  Backend b;
  b.config = std::move(*parsed);
  if (absl::Status s = Validate(b.config); !s.ok()) {
    std::fprintf(stderr, "kimi-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const ServerConfig& c = b.config;
  if (check_only) {
    std::printf("config OK\n");
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(c.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  if (c.threads > 0) setenv("KIMI_NUM_THREADS", std::to_string(c.threads).c_str(), 1);

  // Signals go to one waiting thread; block them everywhere before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Ranks share the CPUs of their cgroup (its cpuset and quota), within what each may use (its
  // affinity mask, which a launcher's binding narrows): by default each takes its share (Open MPI
  // says how many ranks run on this node; cpu_budget.h).
  if (c.threads == 0) {
    if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
      const int ranks_here = std::max(1, std::atoi(local));
      const int threads = cpu::RankThreads(cpu::ProcessCpuBudget(), ranks_here);
      setenv("KIMI_NUM_THREADS", std::to_string(threads).c_str(), 1);
    }
  }
  // Followers keep SIGTERM/SIGINT blocked for good: they stop when rank 0 tells them (after its
  // drain), or when the job is aborted.
  auto cluster = JoinCluster(c);
  if (!cluster.ok()) {
    spdlog::error("{}", std::string(cluster.status().message()));
    if (MpiCommunicator::LaunchedWithMpi()) MpiCommunicator::Abort(std::string(cluster.status().message()));
    return 2;
  }
  // The engine's threads start here, before the load, all at once: a count the system refuses
  // is a setting to change (std::system_error escaping the load aborted the process).
  try {
    cpu::ThreadPool::Global();
  } catch (const std::system_error& e) {
    const std::string message = absl::StrCat(
        "model.threads: cannot start ",
        c.threads > 0 ? absl::StrCat(c.threads) : "the default number of", " engine threads (",
        e.what(), "); lower model.threads (0: one per usable CPU)");
    spdlog::error("{}", message);
    if (cluster->world) MpiCommunicator::Abort(message);
    return 2;
  }
  if (cluster->rank() != 0) return Follow(c, *cluster);

  // A start that fails on rank 0 ends the whole job at once: the other ranks would wait for its
  // first step until parallel.collective_timeout_seconds, then blame its silence.
  auto fail_start = [&](int code, const std::string& message) {
    spdlog::error("{}", message);
    if (cluster->world) MpiCommunicator::Abort(absl::StrCat("rank 0: ", message));
    return code;
  };
  auto keys = ApiKeys::Load(c.api_keys_file);
  if (!keys.ok()) return fail_start(2, std::string(keys.status().message()));
  b.keys = std::move(*keys);
  auto creds = Credentials(c);
  if (!creds.ok()) return fail_start(2, std::string(creds.status().message()));
  auto metrics = Metrics::Start(c.metrics_listen, c.model_name);
  if (!metrics.ok()) return fail_start(1, std::string(metrics.status().message()));
  b.metrics = metrics->get();

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  GenerationService service(&b);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(c.listen, *creds, &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(c.max_request_bytes));
  // gRPC binds with SO_REUSEPORT by default on Linux: a second server on a port in use would start
  // and silently share its connections with the first. Off, the bind fails as it should.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return fail_start(1,
                      absl::StrCat("cannot listen on ", c.listen, " (address in use or invalid)"));
  }
  auto* health = server->GetHealthCheckService();
  // Overall ("") and per service: NOT_SERVING until loaded and warmed up.
  health->SetServingStatus("kimi.v1.Generation", false);
  health->SetServingStatus(false);
  // Ports resolved (":0" picks a free one): tests read them from this line.
  const std::string host = c.listen.substr(0, c.listen.rfind(':'));
  const std::string mhost = c.metrics_listen.substr(0, c.metrics_listen.rfind(':'));
  spdlog::info("gRPC listening on {}:{} ({}), metrics on http://{}:{}/metrics; loading {}", host,
               port,
               c.tls_cert_file.empty() ? "plaintext"
                                       : (c.tls_client_ca_file.empty() ? "TLS" : "mutual TLS"),
               mhost, b.metrics->port(), c.model_path);

  // Load in the background so health and signals answer meanwhile. `load_result`: -1 while
  // loading, 0 serving, else the exit code of a failed start (2: a setting to change).
  std::atomic<int> load_result{-1};
  std::string load_error;  // written by the loader before it sets load_result
  std::mutex phase_mu;
  bool stopping = false;  // a signal came (guarded by phase_mu)
  std::thread loader([&] {
    const auto t0 = std::chrono::steady_clock::now();
    // Test hook: stretch the loading window so tests can see UNAVAILABLE and NOT_SERVING.
    if (const char* delay = std::getenv("KIMI_TEST_LOAD_DELAY_MS")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(delay)));
    }
    auto model = Model::Load(c.model_path, LoadOptions(*cluster));
    auto fail = [&](int code, std::string message) {
      spdlog::error("{}", message);
      load_error = std::move(message);
      load_result = code;
    };
    if (!model.ok()) {
      return fail(1, absl::StrCat("cannot load model: ", model.status().message()));
    }
    b.model = std::move(*model);
    LogThreads();
    if (c.max_context > 0 && c.max_context < b.model->config().max_context) {
      b.model->LimitContext(c.max_context);
    }
    b.model->SetKdaStateDtype(KdaStateDtypeOf(c));
    auto tok = tokenizer::Tokenizer::Load(c.model_path);
    if (!tok.ok()) {
      return fail(1, absl::StrCat("cannot load tokenizer: ", tok.status().message()));
    }
    // A token the model has no row for (an added token past config.json's vocab_size) would be
    // refused only when a prompt holds it, as an internal error.
    if ((*tok)->vocab_size() > b.model->config().vocab) {
      return fail(1, absl::StrCat("the tokenizer has ", (*tok)->vocab_size(),
                                  " ids (tiktoken.model and tokenizer_config.json) but the model's "
                                  "vocab_size is ",
                                  b.model->config().vocab));
    }
    b.tokenizer = std::move(*tok);
    sched::LoopConfig lc;
    lc.scheduler = Pools(c, *b.model);
    // A sequence cannot outgrow the KV pool: the pool bounds the context (as the scheduler does),
    // so requests are checked against it and GetModelInfo reports it.
    if (const int64_t held = sched::PoolContextLimit(lc.scheduler.num_pages, c.page_size);
        held < b.model->config().max_context) {
      spdlog::info(
          "context limit {} tokens: the KV cache pool holds {} pages of {} "
          "(memory.kv_cache_mib {}); the model or --max-context allows {}",
          held, lc.scheduler.num_pages, c.page_size, c.kv_cache_mib, b.model->config().max_context);
      b.model->LimitContext(held);
    }
    lc.text = DetokenizerFactory(b.tokenizer.get());
    lc.engine = EngineOptionsOf(c);
    // The warm-up request's steps (up to the one it ends in, on this same thread) are not the
    // clients': they would show as a prefill, a decode and a prefix-cache query at start-up.
    lc.on_step = [&b, counting = false](const sched::StepStats& step,
                                        const sched::SchedulerStats& stats) mutable {
      if (!counting) {
        b.metrics->OnWarmUpStep(stats);
        counting = b.warmed_up.load();
        return;
      }
      b.metrics->OnStep(step, stats);
    };
    std::unique_ptr<StepRunner> runner;
    if (cluster->world) {
      spdlog::info("{} (pid {})", b.model->shard().Describe(), getpid());
      DistributedOptions d;
      d.slots = lc.scheduler.max_running;
      d.pages = lc.scheduler.num_pages;
      d.page_size = lc.scheduler.page_size;
      d.engine = lc.engine;
      d.heartbeat = HeartbeatFor(std::chrono::seconds(c.collective_timeout_seconds));
      runner = std::make_unique<LeaderStepRunner>(*b.model, cluster->comms(), d);
      // A failed collective leaves the ranks out of step: report NOT_SERVING and end the job.
      lc.on_fatal = [health](const absl::Status& s) {
        health->SetServingStatus(false);
        MpiCommunicator::Abort(std::string(s.message()));
      };
    }
#ifdef KIMI_HAVE_CUDA
    if (const int gpu = CudaOrdinal(c.device); gpu >= 0) {
      CudaRunnerOptions o;
      o.fp32_activations = c.activation_dtype != "bf16";
      auto r = MakeCudaStepRunner(*b.model, lc.scheduler.max_running, lc.scheduler.num_pages,
                                  lc.scheduler.page_size, gpu, o);
      if (!r.ok()) {
        return fail(1, absl::StrCat("cannot start the CUDA backend on ", c.device, ": ",
                                    r.status().message()));
      }
      runner = std::move(*r);
      spdlog::info("engine on {}", c.device);
    }
#endif
    // The pools are allocated here, all at once: a size the machine cannot give is a setting to
    // change, not a crash (std::bad_alloc escaping this thread aborted the process).
    const sched::SchedulerConfig pools = lc.scheduler;
    try {
      b.loop = std::make_unique<sched::EngineLoop>(*b.model, std::move(lc), std::move(runner));
    } catch (const std::bad_alloc&) {
      return fail(2, PoolsTooLarge(c, pools));
    } catch (const std::length_error&) {
      return fail(2, PoolsTooLarge(c, pools));
    }
    b.metrics->SetPools(b.loop->Stats());
    const sched::SchedulerStats st = b.loop->Stats();
    spdlog::info(
        "pools: {} KDA state slots ({} B each, {} state), {} KV pages of {} tokens, "
        "AttnRes cache {} B for {} tokens/step; concurrency {} (minimum over pools)",
        st.slots_total, KdaStatePool::SlotBytes(b.model->config()),
        KdaStateDtypeName(b.model->config().kda.state_dtype), st.pages_total, c.page_size,
        st.attn_res_bytes_total, c.token_budget, b.loop->Concurrency());
    // Sizes that silently gave something else than asked (a k3-mini snapshot is 4.8 MiB: a
    // prefix cache of 4 MiB kept nothing, a state pool of 1 MiB held one slot anyway).
    const int64_t slot_bytes = KdaStatePool::SlotBytes(b.model->config());
    const double slot_mib = static_cast<double>(slot_bytes) / (1 << 20);
    if ((c.kda_state_mib << 20) < slot_bytes) {
      spdlog::warn(
          "memory.kda_state_mib {} is less than one request's KDA state ({:.1f} MiB): one "
          "slot is allocated anyway",
          c.kda_state_mib, slot_mib);
    }
    if (c.prefix_cache_mib > 0 && (c.prefix_cache_mib << 20) < slot_bytes) {
      spdlog::warn(
          "memory.prefix_cache_mib {} holds no snapshot of the KDA state ({:.1f} MiB): "
          "the prefix cache keeps nothing",
          c.prefix_cache_mib, slot_mib);
    } else if (c.prefix_cache_mib > 0 && c.prefix_interval > 0 &&
               (c.prefix_cache_mib << 20) / slot_bytes <= st.slots_total) {
      // The scheduler's shared-prefix wait needs the cache to outlast a step's insertions.
      spdlog::info(
          "memory.prefix_cache_mib {} holds {} snapshots, no more than the {} requests a step may "
          "snapshot: requests sharing a prompt that arrive together each prefill it (at least "
          "{} MiB lets them wait for one snapshot)",
          c.prefix_cache_mib, (c.prefix_cache_mib << 20) / slot_bytes, st.slots_total,
          (slot_bytes * (st.slots_total + 1) + (1 << 20) - 1) >> 20);
    }
    b.loop->Start();
    if (absl::Status s = WarmUp(b); !s.ok()) return fail(1, std::string(s.message()));
    // SERVING only if no signal came first (the main thread holds `phase_mu` while it decides).
    std::lock_guard<std::mutex> lock(phase_mu);
    if (stopping) return;
    b.ready = true;
    health->SetServingStatus(true);
    spdlog::info("SERVING {} after {:.1f}s", c.model_name,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    load_result = 0;
  });

  // Wait for a signal, or for a failed load.
  int sig = 0;
  while (sig <= 0 && load_result.load() <= 0) sig = sigtimedwait(&signals, nullptr, &kSignalPoll);
  if (sig > 0) {
    std::lock_guard<std::mutex> lock(phase_mu);
    stopping = true;
    if (load_result.load() == -1) {
      // A signal during start-up. Loading cannot be interrupted (Model::Load reads and packs the
      // whole checkpoint in one call), and waiting for it and the warm-up took minutes with a
      // big checkpoint, past any orchestrator's grace period, before a drain of nothing. Nothing
      // has been served or written, so the process ends here, as a drain would: exit code 0.
      spdlog::info("{} during start-up: stopping before serving", strsignal(sig));
      spdlog::default_logger()->flush();
      std::fflush(nullptr);
      // The other ranks are told at once (they would wait for rank 0's first step until the
      // collective timeout); mpirun then reports the job as ended by rank 0.
      if (cluster->world) {
        MpiCommunicator::Abort(
            absl::StrCat("rank 0: ", strsignal(sig), " during start-up: stopping before serving"));
      }
      std::_Exit(0);
    }
  }
  loader.join();
  const int failed = load_result.load() > 0 ? load_result.load() : 0;
  health->SetServingStatus(false);
  if (failed && cluster->world) MpiCommunicator::Abort(absl::StrCat("rank 0: ", load_error));
  if (failed) {
    spdlog::info("load failed: stopping");
  } else {
    spdlog::info(
        "{}: draining (up to {}s; a second signal cancels the streams still running), "
        "NOT_SERVING",
        strsignal(sig), c.drain_timeout_seconds);
  }
  if (b.loop) {
    Drain(*b.loop, signals,
          std::chrono::milliseconds(static_cast<int64_t>(c.drain_timeout_seconds * 1000)));
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  spdlog::info("stopped");
  return failed;
}

}  // namespace
}  // namespace kimi::server

int main(int argc, char** argv) { return kimi::server::Run(argc, argv); }
