// Parity with PyTorch, end to end, from committed fixtures (ctest label "parity"): every case of
// the parity harness tools/parity/parity.py (mlp and cnn in one process; DDP with 2 and 4 ranks,
// local BatchNorm, broadcast_buffers on and off, shuffle on and off, both drop_lasts, padding and
// short last batches; SyncBatchNorm against one process on the global batch; DataParallel on
// emulated devices; local SGD against PyTorch's PeriodicModelAverager; Adam and AdamW) runs here in-process with
// the harness's settings, on the first samples of Fashion-MNIST, and is compared with what
// PyTorch 1.13 did (tests/fixtures/parity/<case>.json, written by
// `/usr/bin/python3 tools/parity/parity.py --write-fixtures`):
//   - every rank's loss at every step (metrics.jsonl);
//   - every rank's final parameters and buffers: buffers and small parameters element by element,
//     num_batches_tracked exactly, larger parameters through their summary (sum, sum of |x|, sum
//     of squares, 64 values at evenly spaced indices).
// The tolerances come with the fixture; parity.py ("2. tolerances") says why they are what they
// are, and summary_tolerance() there how the summaries' bounds follow from them. The live
// harness (ctest label parity-live) runs the same cases against PyTorch itself.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "backends.h"
#include "mode.h"
#include "run.h"
#include "zero.h"
#include "test_util.h"
#include "torch_compare.h"

namespace {

// Every case of tools/parity/parity.py (CASES), one fixture each.
const char* const kCases[] = {
    "mlp_1p",        "cnn_1p",      "mlp_w2_bcast", "mlp_w2_nobcast_noshuffle", "mlp_w4_bcast_droplast",
    "mlp_w4_nobcast_pad", "cnn_w2_bcast_noshuffle", "cnn_w4_nobcast_droplast", "mlp_w4_sync", "cnn_w2_sync",
    "mlp_dp4",       "cnn_dp3",     "mlp_w2_localsgd", "cnn_w2_localsgd_nobcast", "cnn_w2_adam", "cnn_w2_adamw",
    "mlp_w2_zero",   "mlp_w3_zero_bucket", "cnn_w3_zero_adam", "cnn_w4_zero_adam_bucket",
};

struct Tol {
  double atol = 0, rtol = 0;
  explicit Tol(const nlohmann::json& j) : atol(j.at("atol").get<double>()), rtol(j.at("rtol").get<double>()) {}
  double at(double ref) const { return atol + rtol * std::fabs(ref); }
};

lab::RunConfig config_for(const nlohmann::json& s, const std::string& out) {
  lab::RunConfig c;
  c.model = s.at("model");
  c.world_size = s.at("world");
  c.batch_size = s.at("batch");
  c.limit_train = s.at("limit_train");
  c.limit_test = s.at("limit_test");
  c.steps = s.at("steps");
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  c.mode = s.at("mode");
  c.bn = s.at("bn");
  c.shuffle = s.at("shuffle");
  c.drop_last = s.at("drop_last");
  c.sampler_drop_last = s.at("sampler_drop_last");
  c.broadcast_buffers = s.at("broadcast_buffers");
  c.average_every = s.at("average_every");
  c.warmup_steps = s.at("warmup_steps");
  c.seed = s.at("seed");
  c.lr = s.at("lr");
  c.optimizer = s.value("optimizer", "sgd");
  if (c.optimizer == "sgd") c.momentum = s.at("momentum");  // (Adam has none: its default stays, unused)
  c.weight_decay = s.at("weight_decay");
  c.parameters_as_bucket_view = s.value("bucket_view", false);
  c.threads = 1;  // as the harness runs dtlab (--threads 1)
  c.out_dir = out;
  c.timeout_s = 60;
  return c;
}

// The largest differences of a case, by kind, for the line every case prints.
struct Worst {
  double loss = 0, param = 0, buffer = 0;
};

std::string fmt(double x) {
  std::ostringstream o;
  o.precision(3);
  o << x;
  return o.str();
}

// A tensor of dtlab (v) against a fixture entry: {"values": [...]} element by element, or a
// summary {"numel", "sum", "abs_sum", "sum_sq", "samples": [[i, x], ...]} (parity.py, section 6).
void compare_tensor(const std::string& who, const std::vector<float>& v, const nlohmann::json& e, const Tol& tol,
                    torchcmp::Compare& cmp, double& worst) {
  auto element = [&](size_t i, double want) {
    ASSERT_LT(i, v.size()) << who;
    cmp.check(who + "[" + std::to_string(i) + "]", v[i], want, tol.atol, tol.rtol);
    worst = std::max(worst, std::fabs(v[i] - want));
  };
  if (e.contains("values")) {
    ASSERT_EQ(v.size(), e["values"].size()) << who;
    for (size_t i = 0; i < v.size(); ++i) element(i, e["values"][i].get<double>());
    return;
  }
  ASSERT_EQ(v.size(), e.at("numel").get<size_t>()) << who;
  double sum = 0, abs_sum = 0, sum_sq = 0;
  for (float x : v) {
    sum += x;
    abs_sum += std::fabs(x);
    sum_sq += static_cast<double>(x) * x;
  }
  // T2 bounds the L2 norm of the elementwise tolerances; the sum of squares' bound follows from
  // them by Cauchy-Schwarz, the sums' is the random-walk estimate sqrt(sum d^2) <= T2.
  const double want_sq = e.at("sum_sq").get<double>();
  const double t2 = std::sqrt(static_cast<double>(v.size())) * tol.atol + tol.rtol * std::sqrt(want_sq);
  cmp.check(who + " sum", sum, e.at("sum").get<double>(), t2, 0);
  cmp.check(who + " abs_sum", abs_sum, e.at("abs_sum").get<double>(), t2, 0);
  cmp.check(who + " sum_sq", sum_sq, want_sq, 2 * std::sqrt(want_sq) * t2 + t2 * t2, 0);
  for (const auto& s : e.at("samples")) element(s[0].get<size_t>(), s[1].get<double>());
}

}  // namespace

class ParityCase : public ::testing::TestWithParam<const char*> {};

TEST_P(ParityCase, MatchesPyTorch) {
  DTLAB_REQUIRE_DATASET();
  const std::string name = GetParam();
  const auto fx = testutil::load_fixture("parity/" + name + ".json");
  ASSERT_EQ(fx.at("format").get<int>(), 1) << name << ": regenerate with tools/parity/parity.py --write-fixtures";
  const auto& settings = fx.at("settings");
  const Tol loss_tol(fx["tolerances"]["loss"]), param_tol(fx["tolerances"]["param"]),
      buffer_tol(fx["tolerances"]["buffer"]);

  testutil::TempDir tmp;
  const lab::RunConfig cfg = config_for(settings, tmp.path());
  lab::Run run(cfg, lab::make_world);
  run.run();

  torchcmp::Compare cmp;
  Worst worst;
  // DataParallel: the fixture holds device 0 (the module, the loss); DDP and local SGD: every rank.
  const auto& ranks = fx.at("ranks");
  const bool one_module = lab::mode_of(cfg).caps().master_device;  // DataParallel's device 0 holds the module
  ASSERT_EQ(ranks.size(), static_cast<size_t>(one_module ? 1 : cfg.world_size)) << name;
  const auto steps = torchcmp::read_steps(tmp.file("metrics.jsonl"), cfg.world_size);
  const auto& rank0_state = ranks[0].at("state");
  int nbt_checked = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string who = "rank " + std::to_string(r);
    const auto& want = ranks[r].at("losses");
    ASSERT_EQ(steps[r].size(), want.size()) << name << " " << who << ": steps in metrics.jsonl";
    for (size_t s = 0; s < want.size(); ++s) {
      const double got = steps[r][s].at("loss").get<double>(), w = want[s].get<double>();
      cmp.check(who + " loss step " + std::to_string(s), got, w, loss_tol.atol, loss_tol.rtol);
      worst.loss = std::max(worst.loss, std::fabs(got - w));
    }
    // A rank > 0 lists only the tensors in which PyTorch's rank differs from its rank 0.
    for (const auto& e : run.replica(static_cast<int>(r)).state_dict()) {
      const auto& mine = ranks[r]["state"];
      ASSERT_TRUE(rank0_state.contains(e.name)) << name << ": " << e.name << " is not in the fixture";
      const auto& entry = mine.contains(e.name) ? mine[e.name] : rank0_state[e.name];
      if (e.buffer && e.buffer->is_int64) {
        EXPECT_EQ(e.buffer->i64, entry.at("int").get<int64_t>()) << name << " " << who << " " << e.name;
        ++nbt_checked;
      } else if (e.buffer) {
        compare_tensor(who + " " + e.name, e.buffer->value.data, entry, buffer_tol, cmp, worst.buffer);
      } else {
        compare_tensor(who + " " + e.name, e.param->value.data, entry, param_tol, cmp, worst.param);
      }
    }
  }
  std::cout << "[ parity   ] " << name << ": max |dloss| " << fmt(worst.loss) << ", max |dparam| "
            << fmt(worst.param) << ", max |dbuffer| " << fmt(worst.buffer) << " (" << cmp.checked << " values)\n";
  EXPECT_TRUE(cmp.ok()) << name << " (" << fx.value("what", "") << ")";
  if (fx.contains("zero_partition")) {  // ZeroRedundancyOptimizer's partition, by parameter name
    const std::vector<std::string> names = lab::param_names(run.replica(0));
    std::vector<std::vector<std::string>> mine;
    for (const std::vector<int>& r : lab::zero_partition(lab::param_numels(run.replica(0)), cfg.world_size)) {
      mine.emplace_back();
      for (int i : r) mine.back().push_back(names[static_cast<size_t>(i)]);
    }
    EXPECT_EQ(mine, fx["zero_partition"].get<std::vector<std::vector<std::string>>>()) << name;
  }
  EXPECT_GT(nbt_checked, 0) << name;
  EXPECT_GT(cmp.checked, 500) << name;
}

INSTANTIATE_TEST_SUITE_P(Parity, ParityCase, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// The fixture directory and the list above name the same cases: a case added to parity.py with
// --write-fixtures is not silently left out here, and a listed case has its fixture.
TEST(ParityFixtures, EveryFixtureIsTested) {
  std::set<std::string> listed(std::begin(kCases), std::end(kCases)), found;
  for (const auto& f : std::filesystem::directory_iterator(std::string(DTLAB_FIXTURES_DIR) + "/parity"))
    if (f.path().extension() == ".json") found.insert(f.path().stem().string());
  EXPECT_EQ(found, listed);
}
