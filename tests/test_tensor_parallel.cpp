// --mode tensor (lab/modes/tensor_parallel.h, mode_tensor.cpp): Megatron-LM's split, measured.
// PARALLELISM.md's facts: a column-parallel layer and the BatchNorm on its features are the whole
// layer's computation, slice by slice; a row-parallel layer's partial sums, added by the allreduce,
// are the whole layer's to rounding; f and g allreduce once each per layer pair (f not at all
// before the model's first layer). PyTorch 1.13 has no usable tensor-parallel API: the reference
// is one-rank training (--mode ddp --world-size 1).
//
// What "slice by slice" means depends on dtlab's sgemm. The reference kernel (DTLAB_SGEMM=reference,
// and the build without a BLAS) adds every output element's k products in one order whatever the
// matrix's shape: there a column-parallel layer's outputs and gradients are the whole layer's bit
// for bit. OpenBLAS (the Haswell kernel the tests run with) does not: which register tile an
// element falls in depends on the rows and columns of the product, and tiles of different widths
// add the same k products in different orders, so a slice computed alone differs in the last bit
// from the same slice of the whole product for a few percent of its elements
// (TensorParallelGemm below). The layers' tests hold bits on the reference kernel and a measured
// bound on OpenBLAS, and TensorParallelColumn.BitForBitOnTheReferenceSgemm runs the bitwise test
// on the reference kernel in a child process. BatchNorm on a rank's features involves no sgemm:
// bits on either kernel.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends.h"
#include "batchnorm.h"
#include "command_line.h"
#include "communicator.h"
#include "conv2d.h"
#include "cpu/gemm_blocked.h"
#include "gemm.h"
#include "errors.h"
#include "linear.h"
#include "model.h"
#include "model_compare.h"
#include "optim.h"
#include "rank_threads.h"
#include "run.h"
#include "tensor_parallel.h"
#include "test_util.h"
#include "torch_rng.h"

namespace {

using lab::TpRole;

std::unique_ptr<lab::Model> model(const std::string& name, uint64_t seed = 0) {
  lab::ModelOptions o;
  o.name = name;
  return lab::build_model(o, seed);
}

lab::Tensor random(std::vector<int64_t> shape, uint64_t seed) {
  lab::Tensor t(std::move(shape));
  lab::TorchGenerator g(seed);
  g.uniform_(t.ptr(), t.numel(), -1.0, 1.0);
  return t;
}

lab::Tensor slice(const lab::Tensor& whole, int dim, int rank, int tp) {
  lab::Tensor s;
  lab::copy_slice(whole, dim, rank, tp, s);
  return s;
}

// The largest difference over the largest magnitude of `want`.
double rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double big = 0, worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    big = std::max(big, std::fabs(static_cast<double>(want[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  return big > 0 ? worst / big : worst;
}

// Whether this process's sgemm is the reference kernel (one order of additions whatever the shape).
bool reference_sgemm() { return std::string(lab::gemm_backend_name()).rfind("reference", 0) == 0; }

// How far a rank's values are from the whole layer's slice: elements whose bits differ, the largest
// difference relative to the largest value (or a given scale), over everything compared.
struct Tally {
  size_t differ = 0, total = 0;
  double rel = 0;
  // scale: what the difference is relative to (0: want's largest value)
  void add(const std::vector<float>& got, const std::vector<float>& want, double scale = 0) {
    double worst = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
      differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    }
    total += want.size();
    rel = std::max(rel, scale > 0 ? worst / scale : rel_diff(got, want));
  }
};

// Bits on the reference sgemm; on another kernel within `bound` of `scale` (0: want's largest value).
void expect_slice(const std::vector<float>& got, const std::vector<float>& want, double bound, Tally& tally,
                  const std::string& what, double scale = 0) {
  tally.add(got, want, scale);
  if (reference_sgemm()) {
    EXPECT_EQ(got, want) << what;
    return;
  }
  if (scale == 0) {
    EXPECT_LT(rel_diff(got, want), bound) << what;
    return;
  }
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
  EXPECT_LT(worst, bound * scale) << what;
}

// The largest gradient of each module's parameters, by state_dict prefix ("1."): the scale of a
// parameter's gradient error. (The bias of a Linear before a BatchNorm has a gradient of zero but
// for rounding, which no two orders of additions share: relative to itself it differs wholly.)
std::map<std::string, double> grad_scales(lab::Model& m) {
  std::map<std::string, double> out;
  for (size_t i = 0; i < m.size(); ++i)
    for (const lab::Param* p : m.module(i).params())
      for (float v : p->grad.data) out[std::to_string(i) + "."] = std::max(out[std::to_string(i) + "."], std::fabs(static_cast<double>(v)));
  return out;
}

// f and g over a test's world: the ranks' Communicator (the ring allreduce, as a run's).
struct CommTp : lab::TpCollectives {
  explicit CommTp(lab::Communicator& c) : comm(c) {}
  void allreduce_sum(float* data, size_t count, const char* what, int tag) override {
    comm.allreduce_sum(data, count, lab::CollectiveInfo{what, tag});
  }
  lab::Communicator& comm;
};

// A collective that must not run (a layer asked for no input gradient).
struct NoComm : lab::TpCollectives {
  void allreduce_sum(float*, size_t, const char* what, int) override { ADD_FAILURE() << "unexpected allreduce: " << what; }
};

// A Model of modules [begin, end) of `whole`: copies (role Replicated) or rank r's shards under the plan.
std::unique_ptr<lab::Model> part(lab::Model& whole, const lab::TpPlan& plan, size_t begin, size_t end, int rank,
                                 bool shards) {
  auto m = std::make_unique<lab::Model>();
  for (size_t i = begin; i < end; ++i)
    m->add(lab::shard_module(whole.module(i), shards ? plan.modules[i].role : TpRole::Replicated, rank, plan.tp));
  return m;
}

using testutil::Apart;
using testutil::apart;

lab::RunConfig tensor_run(const std::string& name, int tp, const std::string& out) {
  lab::RunConfig c = testutil::small_run(name, tp, out, 4);
  c.mode = "tensor";
  c.tp = tp;
  return c;
}

std::string refusal(const lab::RunConfig& c) {
  try {
    lab::validate(c);
  } catch (const lab::ConfigError& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "no error";
}

}  // namespace

// ---- the plan ----

TEST(TensorParallelPlan, MegatronsSplitOfTheMlpAndTheCnn) {
  auto mlp = model("mlp"), cnn = model("cnn");
  const lab::TpPlan p = lab::tensor_parallel_plan(*mlp, 2, "mlp");
  std::string roles;
  for (const auto& m : p.modules) roles += std::string(roles.empty() ? "" : " ") + lab::tp_role_name(m.role);
  // Flatten, fc1, BatchNorm1d(256), ReLU, fc2, BatchNorm1d(128), ReLU, fc3
  EXPECT_EQ(roles, "replicated column local local row replicated replicated replicated");
  ASSERT_EQ(p.pairs.size(), 1u);
  EXPECT_EQ(p.pairs[0], (std::pair<size_t, size_t>{1, 4}));
  EXPECT_EQ(p.forward_allreduces(), 1);
  EXPECT_EQ(p.backward_allreduces(), 0);  // fc1's input is data
  // fc1: rows 0..127 of the weight and of the bias; fc2: columns of the weight, the bias whole
  EXPECT_EQ(p.modules[1].tensors[0].shard, (std::vector<int64_t>{128, 784}));
  EXPECT_EQ(p.modules[1].tensors[1].shard, (std::vector<int64_t>{128}));
  EXPECT_EQ(p.modules[2].tensors[2].name, "running_mean");
  EXPECT_EQ(p.modules[2].tensors[2].shard, (std::vector<int64_t>{128}));
  EXPECT_EQ(p.modules[4].tensors[0].shard, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(p.modules[4].tensors[0].dim, 1);
  EXPECT_EQ(p.modules[4].tensors[1].shard, (std::vector<int64_t>{128}));
  EXPECT_EQ(p.modules[4].tensors[1].dim, -1);
  EXPECT_EQ(p.modules[7].tensors[0].shard, (std::vector<int64_t>{10, 128}));
  EXPECT_EQ(lab::tp_split_sizes(p), (std::vector<int64_t>{256}));

  const lab::TpPlan q = lab::tensor_parallel_plan(*cnn, 4, "cnn");
  roles.clear();
  for (const auto& m : q.modules) roles += std::string(roles.empty() ? "" : " ") + lab::tp_role_name(m.role);
  // conv1, BatchNorm2d(32), ReLU, MaxPool2d, conv2, BatchNorm2d(64), ReLU, MaxPool2d, Flatten, fc1, ReLU, fc2
  EXPECT_EQ(roles, "column local local local row replicated replicated replicated replicated column local row");
  ASSERT_EQ(q.pairs.size(), 2u);
  EXPECT_EQ(q.forward_allreduces(), 2);   // after conv2 and after fc2
  EXPECT_EQ(q.backward_allreduces(), 1);  // before fc1 (conv1's input is data)
  EXPECT_EQ(q.modules[0].tensors[0].shard, (std::vector<int64_t>{8, 1, 3, 3}));
  EXPECT_EQ(q.modules[4].tensors[0].shard, (std::vector<int64_t>{64, 8, 3, 3}));
  EXPECT_EQ(q.modules[9].tensors[0].shard, (std::vector<int64_t>{32, 3136}));
  EXPECT_EQ(q.modules[11].tensors[0].shard, (std::vector<int64_t>{10, 32}));
  EXPECT_EQ(lab::tp_split_sizes(q), (std::vector<int64_t>{32, 128}));
}

TEST(TensorParallelPlan, ATpThatDoesNotDivideASplitLayerIsRefusedByName) {
  auto message = [](const std::string& name, int tp) {
    try {
      lab::tensor_parallel_plan(*model(name), tp, name);
    } catch (const lab::ConfigError& e) {
      return std::string(e.what()) + " | " + e.hint();
    }
    return std::string("no error");
  };
  const std::string m3 = message("mlp", 3);
  EXPECT_NE(m3.find("--tp 3: the mlp's Linear(784, 256) (module 1) is column-parallel"), std::string::npos) << m3;
  EXPECT_NE(m3.find("1, 2, 4, 8, 16, 32 or 64"), std::string::npos) << m3;
  const std::string c64 = message("cnn", 64);
  EXPECT_NE(c64.find("--tp 64: the cnn's Conv2d(1, 32, 3, padding=1, bias=False) (module 0)"), std::string::npos) << c64;
  EXPECT_NE(c64.find("--tp must divide 32 and 128"), std::string::npos) << c64;
  EXPECT_EQ(message("mlp", 64), "no error");  // 4 of fc1's 256 features per rank
  EXPECT_NE(message("cnn", 0).find("--tp must be at least 1"), std::string::npos);
}

// ---- the sgemm under a column split ----

// A column-parallel layer's products are slices of the whole layer's: rows of the weight (its
// output features) times the same input. Computed alone, is a slice the same bits as the whole
// product's? The reference kernel: always (it adds k in order whatever the shape). The process's
// kernel: measured at the models' shapes. OpenBLAS 0.3's Haswell kernel with one thread (as ctest
// runs it): 49113 of the 620544 elements differ (8%), by at most 5.1e-7 of the largest value (an
// element's register tile changes with the slice's width and offset, and with it the order of its k
// additions); its SkylakeX kernel: 9450, at most 6.5e-7.
TEST(TensorParallelGemm, ASliceAloneIsTheWholeProductsOnTheReferenceKernel) {
  struct Shape {
    const char* what;
    bool trans_a, trans_b;
    int m, n, k;  // the whole product C (m, n) = op(A) (m, k) op(B) (k, n); slices cut C's columns (n)
  };
  // As Linear and Conv2d call sgemm: fc1's forward (x W^T: the output features are C's columns),
  // conv1's forward per sample (W cols: the output channels are C's rows, so cut the rows: the
  // transposed product below), fc1's weight gradient (dy^T x: the features are C's rows)
  const Shape shapes[] = {{"fc1 forward x W^T", false, true, 16, 256, 784},
                          {"cnn fc1 forward x W^T", false, true, 16, 128, 3136},
                          {"fc1 weight gradient (dy^T x)^T = x^T dy", true, false, 784, 256, 16}};
  for (bool reference : {true, false}) {
    Tally tally;
    for (const Shape& sh : shapes)
      for (int tp : {2, 4, 8}) {
        const lab::Tensor a = random({sh.trans_a ? sh.k : sh.m, sh.trans_a ? sh.m : sh.k}, 51);
        const lab::Tensor b = random({sh.trans_b ? sh.n : sh.k, sh.trans_b ? sh.k : sh.n}, 52);
        auto gemm = [&](int n0, int n, float* c, int ldc) {
          // columns n0 .. n0 + n of op(B): rows of B when transposed, else columns
          const float* bp = b.ptr() + (sh.trans_b ? static_cast<size_t>(n0) * sh.k : static_cast<size_t>(n0));
          const int ldb = sh.trans_b ? sh.k : sh.n, lda = sh.trans_a ? sh.m : sh.k;
          if (reference) lab::sgemm_blocked(sh.trans_a, sh.trans_b, sh.m, n, sh.k, 1.0f, a.ptr(), lda, bp, ldb, 0.0f, c, ldc);
          else lab::sgemm(sh.trans_a, sh.trans_b, sh.m, n, sh.k, 1.0f, a.ptr(), lda, bp, ldb, 0.0f, c, ldc);
        };
        lab::Tensor whole({sh.m, sh.n});
        gemm(0, sh.n, whole.ptr(), sh.n);
        const int part = sh.n / tp;
        for (int r = 0; r < tp; ++r) {
          lab::Tensor mine({sh.m, part});
          gemm(r * part, part, mine.ptr(), part);
          const lab::Tensor want = slice(whole, 1, r, tp);
          tally.add(mine.data, want.data);
          if (reference) EXPECT_EQ(mine.data, want.data) << sh.what << " tp " << tp << " rank " << r;
          else EXPECT_LT(rel_diff(mine.data, want.data), 1e-6) << sh.what << " tp " << tp << " rank " << r;
        }
      }
    std::printf("%s: %zu of %zu elements of the slices differ from the whole product's, at most %.3g of the largest\n",
                reference ? "reference sgemm" : lab::gemm_backend_name(), tally.differ, tally.total, tally.rel);
  }
}

// ---- column-parallel layers and the local modules after them ----

// The column layer and its local modules (the mlp's Flatten, fc1, BatchNorm1d, ReLU; the cnn's
// conv1, BatchNorm2d, ReLU, MaxPool2d, as one fused run on both sides; the cnn's fc1, ReLU), whole
// and as each rank's slices, forward and backward on the same input and output gradient: every
// rank's output, parameter gradients and running statistics are its slice of the whole layer's,
// bit for bit on the reference sgemm. On OpenBLAS the sgemm's last bits differ (above) and
// BatchNorm's statistics carry them on: 234725 of 1980768 values differ, by at most 4.7e-7 of the
// largest value on the Haswell kernel, 7.4e-7 on SkylakeX (bound 4e-6; a parameter's gradient
// against its module's largest gradient).
TEST(TensorParallelColumn, EachRankComputesItsSliceOfTheWholeLayer) {
  struct Case {
    const char* name;
    size_t begin, end;
    std::vector<int64_t> x;
  };
  const Case cases[] = {{"mlp", 0, 4, {16, 1, 28, 28}}, {"cnn", 0, 4, {8, 1, 28, 28}}, {"cnn", 9, 11, {16, 3136}}};
  Tally tally;
  for (const Case& k : cases)
    for (int tp : {2, 4, 8}) {
      auto whole_model = model(k.name, 3);
      const lab::TpPlan plan = lab::tensor_parallel_plan(*whole_model, tp, k.name);
      auto whole = part(*whole_model, plan, k.begin, k.end, 0, false);
      const lab::Tensor x = random(k.x, 11);
      const lab::Tensor y = whole->forward_range(0, whole->size(), x, lab::Mode::Train);
      const lab::Tensor dy = random(y.shape, 12);
      whole->zero_grad();
      EXPECT_EQ(whole->backward_range(dy), nullptr);
      const auto wstate = whole->state_dict();
      const auto scales = grad_scales(*whole);
      for (int r = 0; r < tp; ++r) {
        const std::string at = std::string(k.name) + " from module " + std::to_string(k.begin) + ", tp " +
                               std::to_string(tp) + " rank " + std::to_string(r);
        auto mine = part(*whole_model, plan, k.begin, k.end, r, true);
        const lab::Tensor& ys = mine->forward_range(0, mine->size(), x, lab::Mode::Train);
        expect_slice(ys.data, slice(y, 1, r, tp).data, 4e-6, tally, at + ": output");
        mine->zero_grad();
        mine->backward_range(slice(dy, 1, r, tp));
        const auto mstate = mine->state_dict();
        ASSERT_EQ(mstate.size(), wstate.size());
        for (size_t i = 0; i < wstate.size(); ++i) {
          const std::string what = at + ": " + wstate[i].name;
          if (wstate[i].param)
            expect_slice(mstate[i].param->grad.data, slice(wstate[i].param->grad, 0, r, tp).data, 4e-6, tally,
                         what + " gradient", scales.at(wstate[i].name.substr(0, wstate[i].name.find('.') + 1)));
          else if (wstate[i].buffer->is_int64)
            EXPECT_EQ(mstate[i].buffer->i64, wstate[i].buffer->i64) << what;
          else
            expect_slice(mstate[i].buffer->value.data, slice(wstate[i].buffer->value, 0, r, tp).data, 4e-6, tally, what);
        }
      }
    }
  std::printf("column-parallel layers on %s: %zu of %zu values differ from the whole layer's slice, at most %.3g\n",
              lab::gemm_backend_name(), tally.differ, tally.total, tally.rel);
}

// The test above on the reference sgemm, where it must hold bit for bit: the kernel is chosen once
// per process (DTLAB_SGEMM), so it runs in a child process of this test binary.
TEST(TensorParallelColumn, BitForBitOnTheReferenceSgemm) {
  if (reference_sgemm()) GTEST_SKIP() << "this process runs the reference sgemm: the test above is bitwise already";
  const testutil::CliResult r = testutil::run_shell(
      "DTLAB_SGEMM=reference /proc/" + std::to_string(getpid()) +
      "/exe --gtest_filter=TensorParallelColumn.EachRankComputesItsSliceOfTheWholeLayer");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("column-parallel layers on reference"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(": 0 of "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[  PASSED  ] 1 test"), std::string::npos) << r.out;
}

// BatchNorm on a rank's features (local): the same input slice gives the slice of the whole
// BatchNorm's output, input gradient, parameter gradients and running statistics, bit for bit on
// any kernel (no sgemm; statistics per feature over the batch): BatchNorm1d(256) -> ReLU, and
// BatchNorm2d(32) -> ReLU -> MaxPool2d run fused (BnReluPool) on both sides.
TEST(TensorParallelLocal, BatchNormOnARanksFeaturesIsBitForBit) {
  struct Case {
    const char* name;
    size_t begin, end;
    std::vector<int64_t> x;
  };
  const Case cases[] = {{"mlp", 2, 4, {16, 256}}, {"cnn", 1, 4, {8, 32, 28, 28}}};
  for (const Case& k : cases)
    for (int tp : {2, 4, 8}) {
      auto whole_model = model(k.name, 3);
      const lab::TpPlan plan = lab::tensor_parallel_plan(*whole_model, tp, k.name);
      // modules [begin, end) after a stand-in module with parameters, so that backward_range
      // returns the gradient of their input
      auto build = [&](int r, bool shards) {
        auto m = std::make_unique<lab::Model>();
        m->add(std::make_unique<lab::Linear>(1, 1));
        for (size_t i = k.begin; i < k.end; ++i)
          m->add(lab::shard_module(whole_model->module(i), shards ? plan.modules[i].role : TpRole::Replicated, r, tp));
        return m;
      };
      auto whole = build(0, false);
      const lab::Tensor x = random(k.x, 61);
      const lab::Tensor y = whole->forward_range(1, whole->size(), x, lab::Mode::Train);
      const lab::Tensor dy = random(y.shape, 62);
      whole->zero_grad();
      const lab::Tensor dx = *whole->backward_range(dy);
      const auto wstate = whole->state_dict();
      for (int r = 0; r < tp; ++r) {
        const std::string at = std::string(k.name) + " tp " + std::to_string(tp) + " rank " + std::to_string(r);
        auto mine = build(r, true);
        const lab::Tensor xs = slice(x, 1, r, tp);  // (the fused run keeps its input until backward)
        EXPECT_EQ(mine->forward_range(1, mine->size(), xs, lab::Mode::Train).data, slice(y, 1, r, tp).data) << at;
        mine->zero_grad();
        EXPECT_EQ(mine->backward_range(slice(dy, 1, r, tp))->data, slice(dx, 1, r, tp).data) << at;
        const auto mstate = mine->state_dict();
        for (size_t i = 2; i < wstate.size(); ++i) {  // (past the stand-in's weight and bias)
          if (wstate[i].param) {
            EXPECT_EQ(mstate[i].param->grad.data, slice(wstate[i].param->grad, 0, r, tp).data) << at << " " << wstate[i].name;
            EXPECT_EQ(mstate[i].param->value.data, slice(wstate[i].param->value, 0, r, tp).data) << at;
          } else if (!wstate[i].buffer->is_int64) {
            EXPECT_EQ(mstate[i].buffer->value.data, slice(wstate[i].buffer->value, 0, r, tp).data) << at << " " << wstate[i].name;
          }
        }
      }
    }
}

// f's backward: a column layer's input gradient is the sum over all its output features; each rank
// computes its own features' part, and the allreduce adds them: the whole layer's to rounding.
// (Measured: at most 3.8e-7 of the largest value for the cnn's fc1 on 2, 4 and 8 ranks, OpenBLAS
// and the reference sgemm alike.)
TEST(TensorParallelColumn, FsBackwardAllreducesTheInputGradient) {
  for (int tp : {2, 4, 8}) {
    auto whole_model = model("cnn", 5);
    auto& fc1 = static_cast<lab::Linear&>(whole_model->module(9));
    const lab::Tensor x = random({16, 3136}, 21);
    lab::Tensor y, dx;
    fc1.forward(x, y, lab::Mode::Train);
    const lab::Tensor dy = random(y.shape, 22);
    fc1.backward(dy, &dx);
    labtest::RankWorld world(tp);
    std::vector<lab::Tensor> got(static_cast<size_t>(tp));
    const auto errors = world.run([&](int r, lab::Communicator& comm) {
      CommTp f(comm);
      lab::ColumnParallel col(lab::shard_module(fc1, TpRole::Column, r, tp), 128, r, tp, f, 9);
      lab::Tensor ys;
      col.forward(x, ys, lab::Mode::Train);
      col.backward(slice(dy, 1, r, tp), &got[static_cast<size_t>(r)]);
    });
    for (const auto& e : errors) ASSERT_EQ(labtest::message_of(e), "");
    for (int r = 1; r < tp; ++r) EXPECT_EQ(got[static_cast<size_t>(r)].data, got[0].data) << "every rank the same bits";
    EXPECT_LT(rel_diff(got[0].data, dx.data), 1e-6) << "tp " << tp;
    for (int r = 0; r < tp; ++r) {
      const auto ev = world.events(r);
      int n = 0;
      for (const lab::Event& e : ev)
        n += e.kind == lab::EventKind::Collective && std::string(e.what) == lab::kTpInputGrads && e.tag == 9;
      EXPECT_EQ(n, 1);
    }
  }
}

// ---- row-parallel layers: rounding ----

// The row layer: each rank's slice of the weight's columns on its slice of the input gives a
// partial output; g allreduces them and the bias is added once. The sum is cut differently from the
// whole layer's (T partial sums added by the ring instead of one running sum), so the output is the
// whole layer's to rounding: measured at most 6.5e-7 of the largest output (the mlp's fc2 and the
// cnn's conv2 and fc2, 2 to 8 ranks; PyTorch 1.13's F.linear split by rows: up to 4e-7). backward:
// g passes dy unchanged, so the weight's gradient and the input's are the whole layer's slices (bit
// for bit on the reference sgemm and OpenBLAS's SkylakeX kernel, within 3.7e-7 of the largest value
// on its Haswell kernel, whose sums depend on the slice's width),
// and the bias's gradient is the whole layer's, bit for bit (summed in double, sample by sample, as
// Linear sums it).
TEST(TensorParallelRow, PartialSumsAddUpToTheWholeLayerToRounding) {
  struct Case {
    const char* name;
    size_t module;
    std::vector<int64_t> x;
  };
  const Case cases[] = {{"mlp", 4, {16, 256}}, {"cnn", 4, {4, 32, 14, 14}}, {"cnn", 11, {16, 128}}};
  double worst = 0;
  Tally tally;
  for (const Case& k : cases)
    for (int tp : {2, 4, 8}) {
      auto whole_model = model(k.name, 7);
      lab::Module& layer = whole_model->module(k.module);
      const lab::Tensor x = random(k.x, 31);
      lab::Tensor y, dx;
      layer.forward(x, y, lab::Mode::Train);
      const lab::Tensor dy = random(y.shape, 32);
      for (lab::Param* p : layer.params()) p->grad.zero();
      layer.backward(dy, &dx);
      const std::vector<lab::Param*> wp = layer.params();
      lab::Tensor bias;
      if (wp.size() > 1) bias = wp[1]->value;
      labtest::RankWorld world(tp);
      std::vector<lab::Tensor> out(static_cast<size_t>(tp)), din(static_cast<size_t>(tp));
      std::vector<std::vector<lab::Tensor>> grads(static_cast<size_t>(tp));
      const auto errors = world.run([&](int r, lab::Communicator& comm) {
        CommTp g(comm);
        lab::RowParallel row(lab::shard_module(layer, TpRole::Row, r, tp), bias, k.x[1], r, tp, g,
                             static_cast<int>(k.module));
        row.forward(slice(x, 1, r, tp), out[static_cast<size_t>(r)], lab::Mode::Train);
        for (lab::Param* p : row.params()) p->grad.zero();
        row.backward(dy, &din[static_cast<size_t>(r)]);
        for (lab::Param* p : row.params()) grads[static_cast<size_t>(r)].push_back(p->grad);
      });
      for (const auto& e : errors) ASSERT_EQ(labtest::message_of(e), "");
      const std::string what = std::string(k.name) + " module " + std::to_string(k.module) + " tp " + std::to_string(tp);
      for (int r = 0; r < tp; ++r) {
        const size_t i = static_cast<size_t>(r);
        EXPECT_EQ(out[i].data, out[0].data) << what << ": every rank the same bits";
        expect_slice(din[i].data, slice(dx, 1, r, tp).data, 1e-6, tally, what + ": input gradient");
        expect_slice(grads[i][0].data, slice(wp[0]->grad, 1, r, tp).data, 1e-6, tally, what + ": weight gradient");
        if (wp.size() > 1) {
          EXPECT_EQ(grads[i][1].data, wp[1]->grad.data) << what;
        }
      }
      const double rel = rel_diff(out[0].data, y.data);
      worst = std::max(worst, rel);
      EXPECT_LT(rel, 1e-6) << what;
    }
  std::printf("row-parallel outputs against the whole layer: at most %.3g of the largest value; gradients on %s: %zu of "
              "%zu differ, at most %.3g\n",
              worst, lab::gemm_backend_name(), tally.differ, tally.total, tally.rel);
}

// ---- one rank's model ----

// Every rank's TensorParallelModel on the same batch: the logits and the loss are the same bits on
// every rank and the one-rank model's to rounding, and so are the gradients (each rank's slice of
// the whole gradient, or the whole one for a replicated module); the allreduces that ran are the
// plan's: the mlp one in forward (g after fc2) and none in backward (fc1's f: its input is data);
// the cnn two in forward (conv2, fc2) and one in backward (before fc1). Measured: logits within
// 1.4e-6 and gradients within 1.3e-6 of their module's largest gradient (OpenBLAS's Haswell and
// SkylakeX kernels, the reference sgemm).
TEST(TensorParallelModel, RanksAgreeAndCountTheirAllreduces) {
  for (const char* name : {"mlp", "cnn"})
    for (int tp : {2, 4}) {
      const lab::Tensor x = random({16, 1, 28, 28}, 41);
      const std::vector<int> labels{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5};
      auto one = model(name, 9);
      const lab::Tensor want = one->forward(x, lab::Mode::Train);
      lab::Tensor dwant;
      const float want_loss = lab::cross_entropy(want, labels, &dwant, nullptr);
      one->zero_grad();
      one->backward(dwant);
      const lab::TpPlan plan = lab::tensor_parallel_plan(*one, tp, name);
      labtest::RankWorld world(tp);
      std::vector<float> losses(static_cast<size_t>(tp));
      std::vector<lab::Tensor> logits(static_cast<size_t>(tp));
      std::vector<std::vector<lab::Tensor>> grads(static_cast<size_t>(tp));
      const auto errors = world.run([&](int r, lab::Communicator& comm) {
        CommTp f(comm);
        auto mine = model(name, 9);
        lab::TensorParallelModel tpm(*mine, plan, r, f);
        const size_t i = static_cast<size_t>(r);
        logits[i] = tpm.model().forward(x, lab::Mode::Train);
        lab::Tensor dl;
        losses[i] = lab::cross_entropy(logits[i], labels, &dl, nullptr);
        comm.set_train_step(0);  // the backward's collectives
        tpm.model().zero_grad();
        tpm.model().backward(dl);
        for (lab::Param* p : tpm.model().params()) grads[i].push_back(p->grad);
      });
      for (const auto& e : errors) ASSERT_EQ(labtest::message_of(e), "");
      const std::string what = std::string(name) + " tp " + std::to_string(tp);
      double worst = 0;
      for (int r = 0; r < tp; ++r) {
        const size_t i = static_cast<size_t>(r);
        EXPECT_EQ(losses[i], losses[0]) << what;
        EXPECT_EQ(logits[i].data, logits[0].data) << what;
        int fwd = 0, bwd = 0;
        for (const lab::Event& e : world.events(r)) {
          if (e.kind != lab::EventKind::Collective) continue;
          fwd += std::string(e.what) == lab::kTpActivations && e.train_step == -1;
          bwd += std::string(e.what) == lab::kTpInputGrads && e.train_step == 0;
        }
        EXPECT_EQ(fwd, plan.forward_allreduces()) << what;
        EXPECT_EQ(bwd, plan.backward_allreduces()) << what;
        // the gradients, parameter by parameter in params() order
        // (relative to the module's largest gradient: the bias of a Linear before a BatchNorm has a
        // gradient of zero but for rounding, which no two orders of additions share)
        const auto whole = one->params();
        size_t k = 0;
        for (const lab::TpModulePlan& m : plan.modules) {
          const std::vector<lab::Param*> ps = one->module(m.index).params();
          double scale = 0;
          for (const lab::Param* p : ps)
            for (float v : p->grad.data) scale = std::max(scale, std::fabs(static_cast<double>(v)));
          for (size_t t = 0; t < ps.size(); ++t, ++k) {
            const int dim = m.tensors[t].dim;
            const lab::Tensor want_grad = dim < 0 ? whole[k]->grad : slice(whole[k]->grad, dim, r, tp);
            double d = 0;
            for (size_t e = 0; e < want_grad.data.size(); ++e)
              d = std::max(d, std::fabs(static_cast<double>(grads[i][k].data[e]) - want_grad.data[e]));
            worst = std::max(worst, d / scale);
            EXPECT_LT(d, 1e-5 * scale) << what << " " << m.describe << " " << m.tensors[t].name;
          }
        }
      }
      EXPECT_LT(rel_diff(logits[0].data, want.data), 4e-6) << what;
      EXPECT_LT(std::fabs(losses[0] - want_loss), 1e-6 * std::fabs(want_loss)) << what;
      std::printf("%s tp %d: logits %.3g, gradients %.3g of their module's largest from one rank's\n", name, tp,
                  rel_diff(logits[0].data, want.data), worst);
    }
}

// Before an evaluation every rank's slices go into the whole model: packed on each rank, unpacked
// into another model's slices, the rest from any rank: the original model, bit for bit.
TEST(TensorParallelModel, SlicesGatherIntoTheWholeModel) {
  for (const char* name : {"mlp", "cnn"})
    for (int tp : {1, 2, 4}) {
      auto whole = model(name, 13);
      // running statistics and a count that are not the defaults
      for (lab::BatchNorm* bn : whole->batchnorms()) {
        lab::TorchGenerator g(5);
        g.uniform_(bn->running_mean().value.ptr(), bn->running_mean().value.numel(), -1.0, 1.0);
        bn->num_batches_tracked().i64 = 7;
      }
      const lab::TpPlan plan = lab::tensor_parallel_plan(*whole, tp, name);
      auto into = model(name, 99);
      NoComm none;
      std::vector<std::unique_ptr<lab::TensorParallelModel>> ranks;
      for (int r = 0; r < tp; ++r) ranks.push_back(std::make_unique<lab::TensorParallelModel>(*whole, plan, r, none));
      for (int r = 0; r < tp; ++r) {
        std::vector<float> packed(ranks[static_cast<size_t>(r)]->packed_floats());
        ranks[static_cast<size_t>(r)]->pack(packed.data());
        ranks[0]->unpack(packed.data(), r, *into);
      }
      ranks[static_cast<size_t>(tp - 1)]->store_whole(*into);
      const Apart a = apart(*into, *whole);
      EXPECT_EQ(a.differ, 0u) << name << " tp " << tp;
    }
}

// ---- whole runs ----

// --mode tensor against one rank training the same batches (--mode ddp --world-size 1, batch 16,
// 4 iterations of SGD with momentum 0.9, lr 0.05), every parameter and buffer of rank 0's final
// (gathered) model, the largest difference relative to the tensor's largest value. Measured: the
// mlp at most 5.5e-7 (--tp 2 and 4; OpenBLAS's Haswell and SkylakeX kernels, the reference sgemm):
// rounding. The cnn 5e-7 on SkylakeX, but 6e-5 on Haswell and on the reference sgemm, all of it in
// conv2's weights for output channel 21: not rounding carried along but max-pooling. Many 2x2
// windows after conv2 hold values equal to their last bits (Fashion-MNIST's flat background); the
// row-parallel sum can break such a near-tie otherwise than the one-rank sum, the window's gradient
// then goes to another of its inputs, and conv2's weight gradient for that channel changes by a
// whole term. Seen: from the same state, iteration 2 on the reference sgemm, exactly one window
// (sample 4, channel 21, window (1, 1): 0.653616011 against 0.65361619) picks another winner, no
// ReLU flips, and channel 21's weight gradient differs by 1e-3 of its largest, the other channels'
// by 4e-7. Bounds: 5e-6 for the mlp, 2e-4 for the cnn.
TEST(TensorParallelRun, IsOneRankTrainingToRounding) {
  DTLAB_REQUIRE_DATASET();
  for (const char* name : {"mlp", "cnn"}) {
    testutil::TempDir d0;
    lab::RunConfig one = tensor_run(name, 1, d0.path());
    one.mode = "ddp";
    one.tp = 0;
    lab::Run a(one, lab::make_world);
    a.run();
    for (int tp : {2, 4}) {
      testutil::TempDir d1;
      lab::Run b(tensor_run(name, tp, d1.path()), lab::make_world);
      b.run();
      const Apart x = apart(a.replica(0), b.replica(0));
      std::printf("%s --tp %d against one rank after 4 iterations: %.3g of the largest value, %zu elements differ\n",
                  name, tp, x.rel, x.differ);
      EXPECT_LT(x.rel, std::string(name) == "mlp" ? 5e-6 : 2e-4) << name << " tp " << tp;
      // the run's loss is counted once (rank 0's), as one rank's
      const auto ja = nlohmann::json::parse(testutil::read_file(d0.file("summary.json")));
      const auto jb = nlohmann::json::parse(testutil::read_file(d1.file("summary.json")));
      EXPECT_EQ(jb.at("samples"), ja.at("samples"));
    }
  }
}

// summary.json's "tensor": the split plan and the allreduces of every iteration as they ran.
TEST(TensorParallelRun, SummaryCountsTheAllreducesThatRan) {
  DTLAB_REQUIRE_DATASET();
  struct Case {
    const char* name;
    int forward, backward;
  };
  for (const Case& k : {Case{"mlp", 1, 0}, Case{"cnn", 2, 1}}) {
    testutil::TempDir d;
    lab::Run run(tensor_run(k.name, 2, d.path()), lab::make_world);
    run.run();
    const auto j = nlohmann::json::parse(testutil::read_file(d.file("summary.json")));
    const auto& t = j.at("tensor");
    const auto& a = t.at("allreduces");
    EXPECT_EQ(a.at("per_iteration").at("forward"), k.forward) << k.name;
    EXPECT_EQ(a.at("per_iteration").at("backward"), k.backward) << k.name;
    EXPECT_TRUE(a.at("uniform").get<bool>()) << k.name;
    EXPECT_EQ(a.at("iterations_counted"), 4);
    // g carries the row layer's whole output: (16, 128) floats for the mlp's fc2; the cnn's conv2
    // (16, 64, 14, 14) and fc2 (16, 10); f the cnn's fc1 input gradient (16, 3136)
    const int64_t fwd_bytes = std::string(k.name) == "mlp" ? 16 * 128 * 4 : (16 * 64 * 14 * 14 + 16 * 10) * 4;
    EXPECT_EQ(a.at("per_iteration").at("forward_bytes"), fwd_bytes);
    EXPECT_EQ(a.at("per_iteration").at("backward_bytes"), std::string(k.name) == "mlp" ? 0 : 16 * 3136 * 4);
    EXPECT_EQ(t.at("modules")[1].at("role"), std::string(k.name) == "mlp" ? "column" : "local");
    EXPECT_NE(testutil::read_file(d.file("config.toml")).find("tp = 2"), std::string::npos);
    EXPECT_GT(j.at("test_eval_mode").at("accuracy").get<double>(), 0.0);
  }
}

// --dp D replicas of the tensor-parallel ranks are DDP on D ranks: each replica trains its shard of
// every batch (a DistributedSampler over the replicas), each slice's gradients (and the replicated
// modules') are averaged over the replicas as DDP's bucket is. With one slice (--tp 1) nothing is
// split and the run is DDP's bits (an average of two is the same sum in either order); with two
// slices it is DDP's to the row layers' rounding (IsOneRankTrainingToRounding's bounds).
TEST(TensorParallelRun, DataParallelReplicasAreDdp) {
  DTLAB_REQUIRE_DATASET();
  for (const char* name : {"mlp", "cnn"}) {
    testutil::TempDir d0;
    lab::RunConfig ddp = tensor_run(name, 2, d0.path());
    ddp.mode = "ddp";
    ddp.tp = 0;
    lab::Run a(ddp, lab::make_world);
    a.run();
    const auto ja = nlohmann::json::parse(testutil::read_file(d0.file("summary.json")));
    for (int tp : {1, 2}) {
      testutil::TempDir d1;
      lab::RunConfig grid = tensor_run(name, tp, d1.path());
      grid.dp = 2;
      grid.world_size = 2 * tp;
      lab::Run b(grid, lab::make_world);
      b.run();
      const Apart x = apart(a.replica(0), b.replica(0));
      std::printf("%s --tp %d --dp 2 against DDP on 2 ranks after 4 iterations: %.3g of the largest value, %zu "
                  "elements differ\n", name, tp, x.rel, x.differ);
      if (tp == 1) EXPECT_EQ(x.differ, 0u) << name;
      else EXPECT_LT(x.rel, std::string(name) == "mlp" ? 5e-6 : 2e-4) << name;
      const auto jb = nlohmann::json::parse(testutil::read_file(d1.file("summary.json")));
      EXPECT_EQ(jb.at("samples"), ja.at("samples")) << name << " tp " << tp;  // each replica's batches, once
      EXPECT_EQ(jb.at("steps_per_epoch"), ja.at("steps_per_epoch")) << name;  // a replica's shard, as a DDP rank's
      if (tp != 2) continue;
      // the grid: Megatron-LM's placement (a replica's slices on neighbouring ranks), its groups, and
      // the bytes each kind of group moved: activations within a replica, gradients across them
      const auto& g = jb.at("grid");
      EXPECT_EQ(g.at("groups").at("tp"), nlohmann::json::parse("[[0, 1], [2, 3]]"));
      EXPECT_EQ(g.at("groups").at("dp"), nlohmann::json::parse("[[0, 2], [1, 3]]"));
      EXPECT_FALSE(g.at("groups").contains("pp"));
      const auto& bytes = g.at("bytes_per_iteration_by_group");
      EXPECT_GT(bytes.at("tp").get<double>(), 0.0) << name;
      EXPECT_GT(bytes.at("dp").get<double>(), 0.0) << name;
      EXPECT_FALSE(bytes.contains("world")) << name;
      // every iteration's allreduces are still one per pair each way, now within the replica
      const auto& a2 = jb.at("tensor").at("allreduces").at("per_iteration");
      EXPECT_EQ(a2.at("forward"), std::string(name) == "mlp" ? 1 : 2);
      EXPECT_TRUE(jb.at("tensor").at("allreduces").at("uniform").get<bool>());
      // each rank's model states are (8+K) Psi_r, Psi_r its slices and copies: what it holds after a step
      for (const auto& r : jb.at("memory").at("per_rank"))
        for (const char* cat : {"parameters", "gradients", "optimizer_state"})
          EXPECT_EQ(r.at("end_of_step").at(cat), r.at("formula").at("model_states").at(cat)) << r.at("rank") << cat;
    }
  }
  // --tp x --dp must be the world size; --tp and --dp alone set it
  lab::RunConfig bad = tensor_run("mlp", 2, "");
  bad.dp = 2;
  EXPECT_NE(refusal(bad).find("--tp 2 x --dp 2 with --world-size 2"), std::string::npos) << refusal(bad);
  EXPECT_EQ(commands::parse_command("run", {"--mode", "tensor", "--tp", "2", "--dp", "3"}).run.world_size, 6);
}

// ---- what it refuses ----

TEST(TensorParallelRun, WhatItCannotDoIsRefusedByName) {
  lab::RunConfig c = tensor_run("mlp", 3, "");
  EXPECT_NE(refusal(c).find("--tp 3: the mlp's Linear(784, 256)"), std::string::npos) << refusal(c);
  c = tensor_run("cnn", 64, "");
  EXPECT_NE(refusal(c).find("--tp 64: the cnn's Conv2d(1, 32"), std::string::npos) << refusal(c);
  c = tensor_run("mlp", 2, "");
  c.world_size = 4;
  EXPECT_NE(refusal(c).find("--tp 2 with --world-size 4"), std::string::npos) << refusal(c);
  c = tensor_run("mlp", 2, "");
  c.bn = "sync";
  EXPECT_NE(refusal(c).find("--bn sync with --mode tensor"), std::string::npos) << refusal(c);
  c = tensor_run("mlp", 2, "");
  c.nondeterministic = true;
  EXPECT_NE(refusal(c).find("--nondeterministic with --mode tensor"), std::string::npos) << refusal(c);
  c = tensor_run("mlp", 2, "");
  c.compute.device = "cuda";
  EXPECT_NE(refusal(c).find("--mode tensor runs on the CPU reference only"), std::string::npos) << refusal(c);
  c = tensor_run("mlp", 2, "");
  c.tp = -1;
  EXPECT_NE(refusal(c).find("--tp must be at least 1, got -1"), std::string::npos) << refusal(c);
  EXPECT_EQ(refusal(tensor_run("cnn", 4, "")), "no error");
  // the command line: --tp alone sets the world size; both given must agree
  EXPECT_EQ(commands::parse_command("run", {"--mode", "tensor", "--tp", "4"}).run.world_size, 4);
  try {
    commands::parse_command("run", {"--mode", "tensor", "--tp", "4", "--world-size", "2"});
    ADD_FAILURE() << "--tp 4 --world-size 2 accepted";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--tp 4 with --world-size 2"), std::string::npos) << e.what();
  }
}
