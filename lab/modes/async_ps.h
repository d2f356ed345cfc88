// --mode async: asynchronous training with a parameter server (Hogwild!, A3C style).
//
// The server holds the model and the optimizer. Each of the world_size workers, in a loop over its
// own DistributedSampler shard:
//   pull   sends a Pull header; receives the server's parameters and buffers and their version
//          (how many updates the server has applied so far)
//   compute forward and backward on its batch, on its copy of the model
//   push   sends a Push header (the version it pulled) and its gradients and buffers; the server
//          applies them at once (one SGD step), whatever the other workers are doing, and answers
//          with the staleness of that gradient: updates applied between its pull and its push
// and a Done header at the end. Buffers (BatchNorm's running statistics) travel with the pushes:
// the server keeps the last pushed ones, as a model in shared memory would (model.share_memory()
// shares buffers, and every worker's forward overwrites them).
//
// Order. "free": the server serves whichever worker's header arrives first (Transport::recv_any):
// the staleness depends on timing, and two runs differ. "seeded": the server serves the workers in
// an order drawn from a seeded generator (uniformly among the workers not done), waiting for the
// drawn one: the same seed gives the same order, staleness and bits, however the threads run.
//
// Messages travel over the Transport between the workers (ranks 0..N-1) and the server (the
// transport of rank N, in the same process; the views show the workers).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "model.h"
#include "optim.h"
#include "transport.h"

namespace lab {

enum class AsyncMsg : int32_t { Pull = 1, Push = 2, Done = 3 };

// A worker's message to the server; the server's answers use the same struct.
struct AsyncHeader {
  int32_t type = 0;        // AsyncMsg (worker -> server); 0 in answers
  int32_t worker = -1;
  int64_t step = -1;       // the worker's iteration
  int64_t version = -1;    // Pull answer: the server's version; Push: the version pulled;
                           // Push answer: the version after applying it
  int64_t staleness = -1;  // Push answer
  float loss = 0;          // Push: the batch's loss, correct answers and samples (epoch figures)
  int32_t correct = 0;
  int32_t samples = 0;
  int32_t pad = 0;
};

// Tags of the protocol, far from the collectives' op_seq tags.
constexpr uint64_t kAsyncTagBase = uint64_t{3} << 60;
constexpr uint64_t kAsyncHeaderTag = kAsyncTagBase + 1;   // worker -> server headers
constexpr uint64_t kAsyncPayloadTag = kAsyncTagBase + 2;  // worker -> server gradients and buffers
constexpr uint64_t kAsyncAnswerTag = kAsyncTagBase + 3;   // server -> worker headers
constexpr uint64_t kAsyncStateTag = kAsyncTagBase + 4;    // server -> worker parameters and buffers

// The model's state as one message (state_pack.h): parameters (or their gradients) and buffers in
// state_dict() order, an int64 buffer (num_batches_tracked) as 8 bytes.
size_t state_bytes(Model& m);
void pack_state(Model& m, bool gradients, std::vector<char>& out);
// Writes parameters (or gradients) and buffers from a message of state_bytes(m).
void unpack_state(Model& m, bool gradients, const std::vector<char>& in);

// The server's side: serves world_size workers until each has sent Done.
class ParameterServer {
 public:
  struct Update {           // one applied push
    int worker = 0;
    int64_t step = 0;       // the worker's iteration
    int64_t staleness = 0;
    float loss = 0;
    int32_t correct = 0, samples = 0;
  };
  // on_update runs after each applied push (epoch bookkeeping, evaluation); its argument is the
  // number of updates applied so far.
  ParameterServer(Model& model, Optimizer& opt, Transport& t, int workers, const std::string& schedule, uint64_t seed);
  void serve(const std::function<void(const Update&, int64_t updates)>& on_update);
  int64_t version() const { return m_version; }

 private:
  int next_worker(const std::vector<int>& active);
  Model& m_model;
  Optimizer& m_opt;
  Transport& m_t;
  int m_workers;
  bool m_seeded;
  std::mt19937_64 m_rng;
  int64_t m_version = 0;
  std::vector<char> m_buf;
};

// The worker's side of one iteration's messages.
class AsyncClient {
 public:
  AsyncClient(Model& model, Transport& t, int server) : m_model(model), m_t(t), m_server(server) {}
  // Copies the server's parameters and buffers into the model; returns their version.
  int64_t pull(int worker, int64_t step);
  // Sends the model's gradients and buffers; returns the server's answer (its new version and
  // this gradient's staleness).
  AsyncHeader push(int worker, int64_t step, int64_t pulled_version, float loss, int correct, int samples);
  void done(int worker);
  size_t bytes() { return state_bytes(m_model); }

 private:
  Model& m_model;
  Transport& m_t;
  int m_server;
  std::vector<char> m_buf;
};

}  // namespace lab
