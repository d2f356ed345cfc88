// Communication behaviour of `dtlab run`: DDP's bucket allreduces on the rank's communication
// thread (overlap) or after backward, bitwise identical either way; the simulated link
// (latency + bytes / bandwidth per message) and the communication time hidden behind backward;
// the new flags in config.toml and `dtlab run --help`.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "backends.h"
#include "comm_worker.h"
#include "ddp.h"
#include "errors.h"
#include "link_model.h"
#include "mode.h"
#include "optim.h"
#include "rank_threads.h"
#include "run.h"
#include "test_util.h"
#include "torch_rng.h"

namespace {

lab::RunConfig small(const std::string& model, int world, const std::string& out) {
  return testutil::small_run(model, world, out, 5);
}

using testutil::without_wall_clock;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// The three ways to launch a bucket's allreduce produce the same gradient bits: same bucket
// contents, same collectives in the same order, same ring reduction order.
TEST(Overlap, EveryBucketLaunchGivesTheSameGradientBits) {
  const int world = 3;
  std::vector<std::vector<std::vector<float>>> grads(3);  // [launch][rank] flat gradients after 2 iterations
  int which = 0;
  for (lab::BucketLaunch launch :
       {lab::BucketLaunch::InHook, lab::BucketLaunch::CommThread, lab::BucketLaunch::AfterBackward}) {
    labtest::RankWorld w(world);
    grads[static_cast<size_t>(which)].resize(world);
    const auto errors = w.run([&](int r, lab::Communicator& comm) {
      lab::ModelOptions o;
      o.name = "cnn";
      auto model = lab::build_model(o, 0);
      lab::CommWorker worker;
      lab::DdpReducer reducer(*model, comm, 0.05, launch, &worker);  // small cap: several buckets
      lab::TorchGenerator g(static_cast<uint64_t>(r) + 1);
      for (int it = 0; it < 2; ++it) {
        lab::Tensor x({4, 1, 28, 28});
        g.uniform_(x.ptr(), x.numel(), -1, 1);
        const std::vector<int> y = {0, 1, 2, 3};
        lab::Tensor dl;
        const lab::Tensor& logits = model->forward(x, lab::Mode::Train);
        lab::cross_entropy(logits, y, &dl, nullptr);
        model->zero_grad();
        reducer.prepare_for_backward();
        model->backward(dl, [&](int i) { reducer.mark_param_ready(i); });
        reducer.finalize_backward();
      }
      EXPECT_GT(reducer.buckets().size(), 2u);
      for (lab::Param* p : model->params())
        grads[static_cast<size_t>(which)][static_cast<size_t>(r)].insert(
            grads[static_cast<size_t>(which)][static_cast<size_t>(r)].end(), p->grad.data.begin(), p->grad.data.end());
    });
    for (const auto& e : errors) EXPECT_EQ(labtest::message_of(e), "");
    ++which;
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(grads[0][static_cast<size_t>(r)], grads[0][0]) << "ranks agree";
    EXPECT_EQ(grads[1][static_cast<size_t>(r)], grads[0][static_cast<size_t>(r)]) << "comm thread, rank " << r;
    EXPECT_EQ(grads[2][static_cast<size_t>(r)], grads[0][static_cast<size_t>(r)]) << "after backward, rank " << r;
  }
}

// Whole runs: --no-overlap changes the timing only. SyncBN's collectives run on the rank's thread
// between the bucket allreduces of the communication thread.
void expect_overlap_changes_nothing(const std::string& model, const std::string& bn) {
  testutil::TempDir a, b;
  auto ca = small(model, 3, a.path());
  ca.bn = bn;
  ca.steps = 3;
  ca.epochs = 0;  // --steps alone: as many epochs as it takes
  ca.limit_test = 16;
  ca.bucket_cap_mb = 0.1;  // several buckets
  auto cb = ca;
  cb.out_dir = b.path();
  cb.overlap = false;
  lab::Run(ca, lab::make_world).run();
  lab::Run(cb, lab::make_world).run();
  EXPECT_EQ(testutil::read_file(a.file("final.safetensors")), testutil::read_file(b.file("final.safetensors")));
  EXPECT_EQ(without_wall_clock(testutil::read_file(a.file("metrics.jsonl"))),
            without_wall_clock(testutil::read_file(b.file("metrics.jsonl"))));
}

TEST(Overlap, CnnWithSyncBatchNormIsBitwiseIdenticalWithAndWithoutOverlap) {
  DTLAB_REQUIRE_DATASET();
  expect_overlap_changes_nothing("cnn", "sync");
}

TEST(Overlap, MlpWithLocalBatchNormIsBitwiseIdenticalWithAndWithoutOverlap) {
  DTLAB_REQUIRE_DATASET();
  expect_overlap_changes_nothing("mlp", "local");
}

// A failure injected into a bucket allreduce on the communication thread still reports the
// failing rank first and stops everyone quickly.
TEST(Overlap, AFailureOnTheCommThreadNamesTheRank) {
  DTLAB_REQUIRE_DATASET();
  auto c = small("mlp", 3, "");
  c.fail_rank = 1;
  c.fail_step = 2;
  c.fail_at = "allreduce";
  c.timeout_s = 10;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    lab::Run(c, lab::make_world).run();
    FAIL() << "expected the run to fail";
  } catch (const lab::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("rank 1 failed: injected failure in allreduce #", 0), 0u) << msg;
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

// ---- the simulated link ----

// One message: arrives latency + bytes / bandwidth after it was sent; back-to-back messages on
// one link queue behind each other (bandwidth), while the sender does not wait.
TEST(LinkModel, MessagesArriveWhenTheModelSays) {
  const lab::LinkModelOptions opt = lab::link_model_options(20000, 0.08);  // 20 ms, 10 MB/s
  const size_t bytes = 100000;                                            // 10 ms on the wire
  lab::LinkModelWorld world(std::make_unique<lab::ThreadsWorld>(2), opt);
  double send_seconds = 0, first = 0, second = 0;
  std::vector<char> a(bytes, 1), b(bytes, 2), in(bytes);
  const auto t0 = std::chrono::steady_clock::now();  // before the sends: arrivals are later
  std::thread receiver([&] {
    world.transport(1).recv(0, in.data(), bytes, 7);
    first = seconds_since(t0);
    world.transport(1).recv(0, in.data(), bytes, 7);
    second = seconds_since(t0);
  });
  world.transport(0).send(1, a.data(), bytes, 7);
  world.transport(0).send(1, b.data(), bytes, 7);
  send_seconds = seconds_since(t0);
  receiver.join();
  EXPECT_LT(send_seconds, 0.005);
  EXPECT_NEAR(opt.seconds(bytes), 0.030, 1e-12);
  EXPECT_GE(first, 0.030);
  EXPECT_LT(first, 0.030 + 0.015);
  EXPECT_GE(second, 0.040);  // its bytes leave after the first message's: 10 + 10 + 20 ms
  EXPECT_LT(second, 0.040 + 0.015);
  EXPECT_EQ(in[0], 2);
}

// A ring allreduce of S bytes on N ranks takes 2(N - 1) steps of latency + (S/N) / bandwidth.
TEST(LinkModel, RingAllreduceTakesTheModeledTime) {
  const int n = 4;
  const size_t count = 250000;  // 1 MB: chunks of 250 kB
  const lab::LinkModelOptions opt = lab::link_model_options(2000, 1.0);  // 2 ms, 125 MB/s
  const double model = 2.0 * (n - 1) * opt.seconds(count * sizeof(float) / n);  // 6 x 4 ms = 24 ms
  lab::LinkModelWorld world(std::make_unique<lab::ThreadsWorld>(n), opt);
  std::vector<double> took(n);
  std::vector<std::thread> ranks;
  // From one clock start for all: every rank's result depends on a chain of 2(N - 1) messages
  // sent after it, whatever the threads' start order.
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      lab::Communicator comm(world.transport(r), nullptr);
      std::vector<float> data(count, static_cast<float>(r));
      comm.allreduce_sum(data.data(), count, lab::CollectiveInfo{"test", -1});
      took[static_cast<size_t>(r)] = seconds_since(t0);
      EXPECT_EQ(data[0], 6.0f);  // 0 + 1 + 2 + 3
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_GE(took[static_cast<size_t>(r)], model * 0.95) << "rank " << r;
    EXPECT_LT(took[static_cast<size_t>(r)], model * 1.5 + 0.05) << "rank " << r;
  }
}

// Waiting on the link honours the timeout and the world's abort.
TEST(LinkModel, AModeledTransferLongerThanTheTimeoutFails) {
  lab::LinkModelWorld world(std::make_unique<lab::ThreadsWorld>(2), lab::link_model_options(2e6, 0));  // 2 s
  world.transport(1).set_timeout(0.2);
  std::thread sender([&] {
    char c = 1;
    world.transport(0).send(1, &c, 1, 3);
  });
  char in = 0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    world.transport(1).recv(0, &in, 1, 3);
    FAIL() << "expected a timeout";
  } catch (const lab::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("simulated link from rank 0"), std::string::npos) << e.what();
  }
  sender.join();
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_TRUE(world.transport(0).aborted());
}

// With the link slowed down, overlapping backward hides part of the bucket allreduces; launching
// them after backward hides none.
TEST(LinkModel, OverlapHidesCommunicationBehindBackward) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a, b;
  auto c = small("cnn", 2, a.path());
  c.batch_size = 32;
  c.steps = 3;
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  c.limit_test = 16;
  c.link_latency_us = 200;
  c.link_gbps = 2;
  lab::Run overlapped(c, lab::make_world);
  const lab::RunSummary& so = overlapped.run();
  c.overlap = false;
  c.out_dir = b.path();
  lab::Run after(c, lab::make_world);
  const lab::RunSummary& sa = after.run();
  EXPECT_GT(so.overlap.hidden_fraction, 0.1);
  EXPECT_EQ(sa.overlap.hidden_seconds_total, 0.0);
  // Bytes on a 2 Gbit/s link take at least bytes / 250 MB/s inside the collectives.
  EXPECT_GT(sa.overlap.comm_seconds[0], static_cast<double>(sa.traffic.sent[0]) / 250e6);
  const auto sj = nlohmann::json::parse(testutil::read_file(a.file("summary.json")));
  EXPECT_DOUBLE_EQ(sj["communication"]["hidden_fraction"].get<double>(), so.overlap.hidden_fraction);
  EXPECT_EQ(sj["communication"]["per_rank"].size(), 2u);
  EXPECT_EQ(testutil::read_file(a.file("final.safetensors")), testutil::read_file(b.file("final.safetensors")));
}

// ---- configuration and flags ----

TEST(ModesConfig, TomlRoundTripAndValidation) {
  testutil::TempDir d;
  lab::RunConfig c;
  c.world_size = 2;
  c.mode = "local-sgd";
  c.average_every = 3;
  c.warmup_steps = 5;
  c.overlap = false;
  c.link_latency_us = 12.5;
  c.link_gbps = 10;
  {
    std::ofstream f(d.file("config.toml"));
    f << lab::to_toml(c, {});
  }
  const lab::RunConfig back = lab::config_from_toml_file(d.file("config.toml"));
  EXPECT_EQ(back.mode, "local-sgd");
  EXPECT_EQ(back.average_every, 3);
  EXPECT_EQ(back.warmup_steps, 5);
  EXPECT_FALSE(back.overlap);
  EXPECT_EQ(back.link_latency_us, 12.5);
  EXPECT_EQ(back.link_gbps, 10);

  auto bad = [](lab::RunConfig x) {
    try {
      lab::validate(x);
    } catch (const lab::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  lab::RunConfig x;
  x.mode = "zero";
  EXPECT_NE(bad(x).find("--mode"), std::string::npos);
  x = {};
  x.average_every = 0;
  EXPECT_EQ(bad(x), "Arg ``period`` must be a positive value.");
  x = {};
  x.warmup_steps = -1;
  EXPECT_EQ(bad(x), "Arg ``warmup_steps`` must be a non-negative number.");
  x = {};
  x.mode = "dp";
  x.bn = "sync";
  EXPECT_NE(bad(x).find("SyncBatchNorm is only supported within"), std::string::npos);
  x = {};
  x.join = true;
  x.bn = "sync";
  EXPECT_NE(bad(x).find("not Joinable"), std::string::npos);
  x = {};
  x.mode = "local-sgd";
  x.no_sync_steps = 2;
  EXPECT_NE(bad(x).find("--no-sync-steps"), std::string::npos);
  EXPECT_EQ(lab::global_batch(x), 64);
  x.mode = "dp";
  x.world_size = 4;
  EXPECT_EQ(lab::global_batch(x), 64);  // DataParallel: --batch-size is the global batch
}

TEST(ModesConfig, RunHelpListsTheModeFlags) {
  const auto r = testutil::run_cli("run --help");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* flag : {"--mode", "--average-every", "--warmup-steps", "--no-overlap", "--no-sync-steps",
                           "--link-latency-us", "--link-gbps", "--uneven-data", "--join"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  const auto bad = testutil::run_cli("run --mode dp --bn sync");
  EXPECT_EQ(bad.exit_code, lab::kExitUsage) << bad.out;
}
