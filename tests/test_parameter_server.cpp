// The parameter server of --mode async (lab/modes/async_ps.h), driven directly over the threads
// transport: what a push applies, what a pull returns, the staleness of each gradient, the seeded
// schedule's order, the model's state as one message, and a header that names the wrong worker.
// Parameters start at 0 and every gradient is a small whole number, so with SGD at lr 1 every
// parameter is exactly minus the sum of the gradients applied, in any order.
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "async_ps.h"
#include "errors.h"
#include "model.h"
#include "optim.h"
#include "threads/transport_threads.h"

namespace {

std::unique_ptr<lab::Model> zero_mlp() {
  lab::ModelOptions o;
  o.name = "mlp";
  auto m = lab::build_model(o, 0);
  for (lab::Param* p : m->params()) p->value.zero();
  return m;
}

// The gradient worker w pushes at its step s: every element the same whole number.
float grad_of(int w, int64_t s) { return static_cast<float>(10 * (w + 1) + s + 1); }

struct Pulled {
  int worker;
  int64_t step, version;
  float value;  // the first parameter's first element after the pull
};

struct Served {
  std::vector<lab::ParameterServer::Update> updates;
  std::vector<Pulled> pulls;
  std::vector<int64_t> staleness_answered;  // what the workers' pushes were told, in no order
  std::vector<float> final_params;          // every element of every parameter, the server's
  int64_t version = 0;
};

// `workers` workers, `steps` pull-compute-push iterations each, against one server.
Served serve(int workers, int64_t steps, const std::string& schedule, uint64_t seed) {
  lab::ThreadsWorld world(workers + 1);
  for (int r = 0; r <= workers; ++r) world.transport(r).set_timeout(20);
  auto server_model = zero_mlp();
  lab::SgdOptions so;
  so.lr = 1.0;
  lab::Optimizer opt(server_model->params(), so);
  Served out;
  std::mutex mu;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(workers) + 1);
  for (int w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      try {
        auto model = zero_mlp();
        lab::AsyncClient client(*model, world.transport(w), workers);
        for (int64_t s = 0; s < steps; ++s) {
          const int64_t v = client.pull(w, s);
          {
            std::lock_guard<std::mutex> lock(mu);
            out.pulls.push_back({w, s, v, model->params()[0]->value.ptr()[0]});
          }
          for (lab::Param* p : model->params()) p->grad = lab::Tensor(p->value.shape, grad_of(w, s));
          const lab::AsyncHeader a = client.push(w, s, v, 0.5f, 3, 16);
          std::lock_guard<std::mutex> lock(mu);
          out.staleness_answered.push_back(a.staleness);
        }
        client.done(w);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(w)] = e.what();
      }
    });
  try {
    lab::ParameterServer server(*server_model, opt, world.transport(workers), workers, schedule, seed);
    server.serve([&](const lab::ParameterServer::Update& u, int64_t updates) {
      out.updates.push_back(u);
      EXPECT_EQ(updates, static_cast<int64_t>(out.updates.size()));
    });
    out.version = server.version();
  } catch (const std::exception& e) {
    errors.back() = e.what();
  }
  for (auto& t : threads) t.join();
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (lab::Param* p : server_model->params())
    out.final_params.insert(out.final_params.end(), p->value.ptr(), p->value.ptr() + p->value.numel());
  return out;
}

}  // namespace

TEST(ParameterServer, EveryPushIsOneSgdStepAndEveryPullTheServersModelAtItsVersion) {
  const int workers = 3;
  const int64_t steps = 4;
  const Served s = serve(workers, steps, "free", 0);
  ASSERT_EQ(s.updates.size(), static_cast<size_t>(workers * steps));
  EXPECT_EQ(s.version, workers * steps);
  // each push applied once: every parameter is minus the sum of all gradients
  float total = 0;
  for (int w = 0; w < workers; ++w)
    for (int64_t st = 0; st < steps; ++st) total += grad_of(w, st);
  for (float v : s.final_params) ASSERT_EQ(v, -total);
  // the loss, correct answers and samples a push carried reach the server's bookkeeping
  for (const auto& u : s.updates) {
    EXPECT_EQ(u.loss, 0.5f);
    EXPECT_EQ(u.correct, 3);
    EXPECT_EQ(u.samples, 16);
  }
  // a pull at version v returns the model after the first v updates, in the order applied
  std::vector<float> after(s.updates.size() + 1, 0.0f);
  for (size_t i = 0; i < s.updates.size(); ++i) after[i + 1] = after[i] - grad_of(s.updates[i].worker, s.updates[i].step);
  ASSERT_EQ(s.pulls.size(), s.updates.size());
  for (const Pulled& p : s.pulls) {
    ASSERT_GE(p.version, 0);
    ASSERT_LE(p.version, static_cast<int64_t>(s.updates.size()));
    EXPECT_EQ(p.value, after[static_cast<size_t>(p.version)]) << "worker " << p.worker << " step " << p.step;
  }
  // staleness: the updates applied between a worker's pull and its push
  for (size_t i = 0; i < s.updates.size(); ++i) {
    const auto& u = s.updates[i];
    int64_t pulled = -1;
    for (const Pulled& p : s.pulls)
      if (p.worker == u.worker && p.step == u.step) pulled = p.version;
    EXPECT_EQ(u.staleness, static_cast<int64_t>(i) - pulled) << "update " << i;
  }
}

TEST(ParameterServer, OneWorkerIsNeverStale) {
  const Served s = serve(1, 5, "seeded", 7);
  ASSERT_EQ(s.updates.size(), 5u);
  for (const auto& u : s.updates) EXPECT_EQ(u.staleness, 0);
  for (int64_t a : s.staleness_answered) EXPECT_EQ(a, 0);
}

// "seeded": the server draws whom to serve next from its generator, so the order, the staleness
// and the bits are the seed's, however the threads ran; another seed gives another order.
TEST(ParameterServer, TheSeededScheduleIsTheSeeds) {
  auto order = [](const Served& s) {
    std::vector<std::tuple<int, int64_t, int64_t>> o;
    for (const auto& u : s.updates) o.emplace_back(u.worker, u.step, u.staleness);
    return o;
  };
  const Served a = serve(3, 4, "seeded", 11), b = serve(3, 4, "seeded", 11), c = serve(3, 4, "seeded", 12);
  EXPECT_EQ(order(a), order(b));
  EXPECT_NE(order(a), order(c));
  int64_t stale = 0;
  for (const auto& u : a.updates) stale += u.staleness;
  EXPECT_GT(stale, 0) << "three workers, and no gradient was ever stale";
}

TEST(ParameterServer, TheModelsStateIsOneMessage) {
  lab::ModelOptions o;
  o.name = "mlp";
  auto a = lab::build_model(o, 1), b = lab::build_model(o, 2);
  for (lab::Param* p : a->params()) p->grad = lab::Tensor(p->value.shape, 0.25f);
  for (const lab::StateEntry& e : a->state_dict())
    if (e.buffer && e.buffer->is_int64) e.buffer->i64 = 41;
  size_t floats = 0, int64s = 0;
  for (const lab::StateEntry& e : a->state_dict()) {
    if (e.param) floats += static_cast<size_t>(e.param->value.numel());
    else if (e.buffer && e.buffer->is_int64) ++int64s;
    else if (e.buffer) floats += static_cast<size_t>(e.buffer->value.numel());
  }
  EXPECT_EQ(lab::state_bytes(*a), floats * 4 + int64s * 8);
  std::vector<char> msg;
  lab::pack_state(*a, false, msg);
  lab::unpack_state(*b, false, msg);
  const auto sa = a->state_dict(), sb = b->state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    if (sa[i].param) EXPECT_EQ(sa[i].param->value.data, sb[i].param->value.data) << sa[i].name;
    else if (sa[i].buffer->is_int64) EXPECT_EQ(sb[i].buffer->i64, 41) << sa[i].name;
    else EXPECT_EQ(sa[i].buffer->value.data, sb[i].buffer->value.data) << sa[i].name;
  }
  // gradients: into .grad (made the parameter's size), the values untouched
  auto c = lab::build_model(o, 3);
  const std::vector<float> before = c->params()[0]->value.data;
  lab::pack_state(*a, true, msg);
  lab::unpack_state(*c, true, msg);
  for (lab::Param* p : c->params()) EXPECT_EQ(p->grad.data, std::vector<float>(p->value.data.size(), 0.25f)) << p->name;
  EXPECT_EQ(c->params()[0]->value.data, before);
}

TEST(ParameterServer, AHeaderNamingAnotherWorkerIsACommError) {
  lab::ThreadsWorld world(3);
  for (int r = 0; r < 3; ++r) world.transport(r).set_timeout(10);
  auto model = zero_mlp();
  lab::Optimizer opt(model->params(), lab::SgdOptions{});
  std::thread liar([&] {
    lab::AsyncHeader h;
    h.type = static_cast<int32_t>(lab::AsyncMsg::Pull);
    h.worker = 1;  // but it is rank 0
    world.transport(0).send(2, &h, sizeof h, lab::kAsyncHeaderTag);
  });
  lab::ParameterServer server(*model, opt, world.transport(2), 2, "free", 0);
  try {
    server.serve(nullptr);
    ADD_FAILURE() << "the server served a header that names another worker";
  } catch (const lab::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("worker 0 sent a header naming worker 1"), std::string::npos) << e.what();
  }
  liar.join();
}
