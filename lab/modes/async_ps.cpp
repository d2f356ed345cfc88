#include "async_ps.h"

#include <algorithm>
#include <cstring>

#include "errors.h"
#include "mutation.h"
#include "state_pack.h"

namespace lab {

size_t state_bytes(Model& m) { return StatePack(m, kPackParams | kPackBuffers).bytes(); }

void pack_state(Model& m, bool gradients, std::vector<char>& out) {
  m.to_host(gradients ? kStateBuffers | kStateGrads : kStateModel);  // a device's state (executor.h: residency)
  const StatePack pack(m, (gradients ? kPackGrads : kPackParams) | kPackBuffers);
  out.resize(pack.bytes());
  pack.pack(out.data());
}

void unpack_state(Model& m, bool gradients, const std::vector<char>& in) {
  const StatePack pack(m, (gradients ? kPackGrads : kPackParams) | kPackBuffers);
  assert(in.size() == pack.bytes());
  pack.unpack(in.data());
  m.host_changed(gradients ? kStateBuffers | kStateGrads : kStateModel);
}

// ---- the server ----

ParameterServer::ParameterServer(Model& model, Optimizer& opt, Transport& t, int workers, const std::string& schedule,
                                 uint64_t seed)
    : m_model(model), m_opt(opt), m_t(t), m_workers(workers), m_seeded(schedule == "seeded"), m_rng(seed) {}

int ParameterServer::next_worker(const std::vector<int>& active) {
  std::uniform_int_distribution<size_t> pick(0, active.size() - 1);
  return active[pick(m_rng)];
}

void ParameterServer::serve(const std::function<void(const Update&, int64_t updates)>& on_update) {
  std::vector<int> active(static_cast<size_t>(m_workers));
  for (int w = 0; w < m_workers; ++w) active[static_cast<size_t>(w)] = w;
  const size_t bytes = state_bytes(m_model);
  // Lessons' mutation tests (mutation.h). async-no-interleaving: a worker that pulled is served
  // again until it has pushed, so no other push comes between its pull and its push (nothing is
  // ever stale). async-take-turns: the seeded schedule serves the workers in turn, each worker's
  // push followed by its next pull, so the N-1 others push between any worker's pull and push.
  const bool no_interleaving = mutated("async-no-interleaving");
  const bool take_turns = m_seeded && mutated("async-take-turns");
  int stay = -1;       // with a mutation: the worker whose next message is served next
  size_t turn = 0;     // with take_turns: the next worker's turn
  while (!active.empty()) {
    AsyncHeader h;
    int w = -1;
    if (stay >= 0) {
      w = stay;
      m_t.recv(w, &h, sizeof h, kAsyncHeaderTag);
    } else if (m_seeded) {
      // the drawn worker's next message, whatever the others have sent meanwhile
      w = take_turns ? active[turn++ % active.size()] : next_worker(active);
      m_t.recv(w, &h, sizeof h, kAsyncHeaderTag);
    } else {
      w = m_t.recv_any(active, &h, sizeof h, kAsyncHeaderTag);
    }
    if (h.worker != w) throw CommError("parameter server: worker " + std::to_string(w) + " sent a header naming worker " + std::to_string(h.worker));
    AsyncHeader answer;
    answer.worker = w;
    answer.step = h.step;
    switch (static_cast<AsyncMsg>(h.type)) {
      case AsyncMsg::Pull:
        stay = no_interleaving ? w : -1;
        answer.version = m_version;
        pack_state(m_model, false, m_buf);
        m_t.send(w, &answer, sizeof answer, kAsyncAnswerTag);
        m_t.send(w, m_buf.data(), m_buf.size(), kAsyncStateTag);
        break;
      case AsyncMsg::Push: {
        m_buf.resize(bytes);
        m_t.recv(w, m_buf.data(), bytes, kAsyncPayloadTag);
        // the gradients into .grad and the worker's buffers over the server's, then one SGD step
        unpack_state(m_model, true, m_buf);
        m_opt.step();
        answer.staleness = m_version - h.version;
        ++m_version;
        answer.version = m_version;
        m_t.send(w, &answer, sizeof answer, kAsyncAnswerTag);
        if (on_update) on_update(Update{w, h.step, answer.staleness, h.loss, h.correct, h.samples}, m_version);
        stay = take_turns ? w : -1;
        break;
      }
      case AsyncMsg::Done:
        stay = -1;
        active.erase(std::find(active.begin(), active.end(), w));
        break;
      default:
        throw CommError("parameter server: unknown message type " + std::to_string(h.type) + " from worker " + std::to_string(w));
    }
  }
}

// ---- the worker ----

int64_t AsyncClient::pull(int worker, int64_t step) {
  AsyncHeader h;
  h.type = static_cast<int32_t>(AsyncMsg::Pull);
  h.worker = worker;
  h.step = step;
  m_t.send(m_server, &h, sizeof h, kAsyncHeaderTag);
  AsyncHeader a;
  m_t.recv(m_server, &a, sizeof a, kAsyncAnswerTag);
  m_buf.resize(state_bytes(m_model));
  m_t.recv(m_server, m_buf.data(), m_buf.size(), kAsyncStateTag);
  unpack_state(m_model, false, m_buf);
  return a.version;
}

AsyncHeader AsyncClient::push(int worker, int64_t step, int64_t pulled_version, float loss, int correct, int samples) {
  AsyncHeader h;
  h.type = static_cast<int32_t>(AsyncMsg::Push);
  h.worker = worker;
  h.step = step;
  h.version = pulled_version;
  h.loss = loss;
  h.correct = correct;
  h.samples = samples;
  pack_state(m_model, true, m_buf);
  m_t.send(m_server, &h, sizeof h, kAsyncHeaderTag);
  m_t.send(m_server, m_buf.data(), m_buf.size(), kAsyncPayloadTag);
  AsyncHeader a;
  m_t.recv(m_server, &a, sizeof a, kAsyncAnswerTag);
  return a;
}

void AsyncClient::done(int worker) {
  AsyncHeader h;
  h.type = static_cast<int32_t>(AsyncMsg::Done);
  h.worker = worker;
  m_t.send(m_server, &h, sizeof h, kAsyncHeaderTag);
}

}  // namespace lab
