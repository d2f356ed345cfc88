// Run's --mode async (async_ps.h): the workers' loop and the parameter server's thread. The
// workers are the run's ranks 0..N-1 (what the views show); the server has transport N.
//   worker   for each batch of its DistributedSampler shard: pull (events "pull", with the
//            bytes received), forward, backward, push (event "push", its tag the gradient's
//            staleness); the step record carries staleness and the version pulled
//   server   applies every push at once (one SGD step on its model); after every N x
//            steps_per_epoch updates, one epoch: it evaluates its model on the test set and steps
//            the learning-rate schedule; at the end every worker's model is the server's
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "async_ps.h"
#include "communicator.h"
#include "dataset.h"
#include "optim.h"
#include "run.h"
#include "run_internal.h"
#include "sampler.h"

namespace lab {

void Run::rank_main_async(int rank) {
  const RunConfig& c = m_cfg;
  const int workers = c.world_size;
  Model& model = *m_replicas[static_cast<size_t>(rank)];
  RankState& rs = *m_ranks[static_cast<size_t>(rank)];
  Transport& transport = m_world->transport(rank);
  Communicator comm(transport, m_logs[static_cast<size_t>(rank)].get(), m_control.get());
  try {
    AsyncClient client(model, transport, workers);  // the server's transport is number `workers`
    const uint64_t state = client.bytes();
    std::vector<BatchNorm*> bns = model.batchnorms();
    std::vector<int> bn_index = model.batchnorm_module_index();
    const int64_t epochs = epochs_total();
    DistributedSampler sampler({m_train.size, workers, rank, c.shuffle, c.seed, c.sampler_drop_last});
    // A transfer of the protocol, as the timeline and the traffic figures see it.
    auto transfer = [&](const char* op, const char* what, int32_t tag, int src, int dst, double t0) {
      Event coll = comm.collective_event(op, comm.next_seq(), CollectiveInfo{what, tag}, state);
      coll.t_start = t0;
      coll.t_end = now_seconds();
      Event chunk = coll;
      chunk.kind = EventKind::Chunk;
      chunk.src = src;
      chunk.dst = dst;
      chunk.chunk = 0;
      chunk.ring_step = 0;
      comm.record(chunk);
      comm.record(coll);
      if (src == rank) comm.add_bytes_sent(state);
    };
    Tensor x, dlogits;
    std::vector<int> labels;
    int64_t step = 0;
    for (int64_t epoch = 0; epoch < epochs && step < m_steps_total; ++epoch) {
      sampler.set_epoch(epoch);
      const auto batches = make_batches(sampler.indices(), c.batch_size, c.drop_last);
      for (size_t bi = 0; bi < batches.size() && step < m_steps_total; ++bi, ++step) {
        m_control->before_iteration(rank, step);
        comm.set_train_step(step);
        const int64_t n = static_cast<int64_t>(batches[bi].size());
        gather_batch(m_train, batches[bi], x, labels);
        if (n == 1)
          for (BatchNorm* b : bns) b->set_error_hint(batch_of_one_hint(c, rank, bi, epoch, sampler.num_samples()));
        const bool inject = rank == c.fail_rank && step == (c.fail_step < 0 ? 0 : c.fail_step);
        if (inject && c.fail_at == "forward") throw InjectedFailure("injected failure before forward (--fail-at forward)");
        if (inject && c.fail_at == "hang") {
          while (!transport.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          throw StopRequested{};
        }
        double t0 = now_seconds();
        const int64_t version = client.pull(rank, step);
        transfer("pull", "parameters", -1, workers, rank, t0);

        const Tensor& logits = comm.timed(Phase::Forward, "forward", step, [&]() -> const Tensor& { return model.forward(x, Mode::Train); });
        int correct = 0;
        const float loss = cross_entropy(logits, labels, &dlogits, &correct);
        comm.timed(Phase::Backward, "backward", step, [&] {
          model.zero_grad();
          model.backward(dlogits);
          if (inject && c.fail_at == "backward") throw InjectedFailure("injected failure in backward (--fail-at backward)");
        });
        t0 = now_seconds();
        const AsyncHeader answer = client.push(rank, step, version, loss, correct, static_cast<int>(n));
        transfer("push", "gradient", static_cast<int32_t>(answer.staleness), rank, workers, t0);

        StepRecord rec;
        rec.rank = rank;
        rec.step = step;
        rec.epoch = epoch;
        rec.batch = static_cast<int64_t>(bi);
        rec.batch_size = n;
        rec.loss = loss;
        rec.correct = correct;
        rec.bytes_sent = comm.bytes_sent();
        rec.t = now_seconds() - m_t0;
        rec.staleness = answer.staleness;
        rec.version = version;
        rec.bn = bn_layer_records(bns, bn_index, c.track_running_stats);
        {
          std::lock_guard<std::mutex> lock(rs.mu);
          rs.trained_samples += n;
          rs.latest = std::make_shared<const StepRecord>(rec);
          rs.pending.push_back(std::move(rec));
        }
        if (rank == 0 && eval_due(step + 1)) {  // worker 0's model: the weights it pulled, updated once
          EvalPoint p = comm.timed(Phase::Eval, "periodic eval", step, [&] { return evaluate_point(model, step + 1, epoch); });
          std::lock_guard<std::mutex> lock(m_epoch_mu);
          m_evals.push_back(std::move(p));
        }
      }
    }
    client.done(rank);
  } catch (const StopRequested&) {
  } catch (const CommError& e) {
    if (!m_control->stopped()) fail_rank(rank, e, true);
  } catch (const std::exception& e) {
    fail_rank(rank, e, false);
  }
  --m_running;
}

void Run::server_main() {
  const RunConfig& c = m_cfg;
  const int workers = c.world_size;
  Transport& transport = m_world->transport(workers);
  try {
    Model& model = *m_server_model;
    SgdOptions so;
    so.lr = c.lr;
    so.momentum = c.momentum;
    so.weight_decay = c.weight_decay;
    so.nesterov = c.nesterov;
    Sgd opt(model.params(), so);
    const int64_t epochs = epochs_total();
    LrSchedule schedule(lr_schedule_options(c, epochs));
    // one epoch of the server: every worker's batches of one epoch (the last one may be cut by --steps)
    const int64_t per_epoch = m_steps_per_epoch * workers;
    const int64_t total = m_steps_total * workers;
    int64_t epoch = 0, ep_updates = 0, ep_samples = 0, ep_correct = 0;
    double ep_loss = 0, t_epoch0 = now_seconds();
    ParameterServer server(model, opt, transport, workers, c.async_schedule, c.async_seed);
    server.serve([&](const ParameterServer::Update& u, int64_t updates) {
      {
        std::lock_guard<std::mutex> lock(m_async_mu);
        m_async_updates.emplace_back(u.worker, u.staleness);
      }
      ++ep_updates;
      ep_loss += u.loss;
      ep_samples += u.samples;
      ep_correct += u.correct;
      if (updates % per_epoch != 0 && updates != total) return;
      // the end of an epoch: evaluate the server's model, as a user of a parameter server does
      const double t_eval = now_seconds();
      const EvalResult r = lab::evaluate(model, Mode::Eval, m_test, c.eval_batch_size, 0, m_test.size);
      EpochRecord e;
      e.epoch = epoch;
      e.steps = std::min(m_steps_total, (epoch + 1) * m_steps_per_epoch);
      e.train_loss = ep_updates ? ep_loss / static_cast<double>(ep_updates) : 0.0;
      e.train_acc = ep_samples ? static_cast<double>(ep_correct) / static_cast<double>(ep_samples) : 0.0;
      e.test_loss = r.loss;
      e.test_acc = r.acc;
      e.seconds = t_eval - t_epoch0;
      e.samples_per_s = e.seconds > 0 ? static_cast<double>(ep_samples) / e.seconds : 0.0;
      e.lr = opt.options().lr;
      {
        std::lock_guard<std::mutex> lock(m_epoch_mu);
        m_epochs.push_back(e);
      }
      ++epoch;
      ep_updates = ep_samples = ep_correct = 0;
      ep_loss = 0;
      schedule.step();
      opt.set_lr(schedule.lr());
      t_epoch0 = now_seconds();
    });
  } catch (const std::exception& e) {
    // Stopped, or a worker failed (its own error is the root cause): nothing to add. Otherwise the
    // server's own failure (a worker that stopped answering times it out) ends every worker.
    const auto* le = dynamic_cast<const Error*>(&e);
    {
      std::lock_guard<std::mutex> lock(m_err_mu);
      if (!m_control->stopped() && m_root_code == 0) {
        m_root_rank = -1;
        m_root_code = le ? le->exit_code() : kExitFailure;
        m_root_what = std::string("the parameter server failed: ") + e.what();
        m_root_hint = le ? le->hint() : "";
      }
    }
    transport.abort(std::string("the parameter server failed: ") + e.what());
  }
  m_server_done = true;
  --m_running;
}

}  // namespace lab
