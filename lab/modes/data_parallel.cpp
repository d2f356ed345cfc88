// nn.DataParallel over emulated devices: see data_parallel.h for the steps of one iteration.
//
// Messages. Every operation (scatter, replicate, gather, output-gradient scatter, reduce) takes
// one sequence number from the Communicator on EVERY device, used or idle, so op_seq stays
// identical everywhere; its messages carry that number as their tag. Each message is one Chunk
// event recorded by its sender (src, dst, bytes; chunk = the device the data belongs to), and
// each device that takes part records one Collective event for the whole operation, so the trace
// shows device 0's share of the traffic and the communication track of every device.
#include "data_parallel.h"

#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "state_pack.h"

#include "errors.h"
#include "mutation.h"

namespace lab {

namespace {

constexpr int64_t kSampleFloats = 28 * 28;  // one input sample (1, 28, 28)
constexpr int64_t kClasses = 10;            // logits per sample

std::string join_sizes(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// Drops a leading "rank R: " (this device's own prefix) so the context is not said twice.
std::string strip_rank(const std::string& msg, int rank) {
  const std::string prefix = "rank " + std::to_string(rank) + ": ";
  return msg.compare(0, prefix.size(), prefix) == 0 ? msg.substr(prefix.size()) : msg;
}

}  // namespace

std::vector<int64_t> torch_chunk_sizes(int64_t batch, int chunks) {
  std::vector<int64_t> sizes;
  if (batch <= 0 || chunks <= 0) return sizes;
  const int64_t size = (batch + chunks - 1) / chunks;  // ceil: torch.chunk's split size
  for (int64_t left = batch; left > 0; left -= size) sizes.push_back(std::min(size, left));
  return sizes;
}

SingleProcessLoader::SingleProcessLoader(int64_t length, int64_t batch_size, bool shuffle, bool drop_last,
                                         uint64_t seed)
    : m_length(length), m_batch(batch_size), m_shuffle(shuffle), m_drop_last(drop_last), m_gen(seed) {}

std::vector<std::vector<int64_t>> SingleProcessLoader::next_epoch() {
  std::vector<int64_t> order;
  if (m_shuffle) {
    (void)m_gen.random64();  // _BaseDataLoaderIter: _base_seed = int64 random_(generator)
    order = randperm(m_length, m_gen);
    if (m_length > 0) (void)randperm(m_length, m_gen);  // RandomSampler: randperm(n)[:num_samples % n]
  } else {
    order.resize(static_cast<size_t>(m_length));
    for (int64_t i = 0; i < m_length; ++i) order[static_cast<size_t>(i)] = i;
  }
  std::vector<std::vector<int64_t>> batches;
  for (int64_t s = 0; s < m_length; s += m_batch) {
    const int64_t n = std::min(m_batch, m_length - s);
    if (n < m_batch && m_drop_last) break;
    batches.emplace_back(order.begin() + s, order.begin() + s + n);
  }
  return batches;
}

DataParallelDevice::DataParallelDevice(Model& model, Communicator& comm, Optimizer& opt)
    : m_model(model), m_comm(comm), m_opt(opt), m_device(comm.rank()), m_devices(comm.world_size()) {}

void DataParallelDevice::send(int peer, const void* data, size_t bytes, uint64_t seq, Phase phase, const char* op,
                              const char* what) {
  Event e;
  e.kind = EventKind::Chunk;
  e.phase = phase;
  e.op = op;
  e.what = what;
  e.rank = m_device;
  e.src = m_device;
  e.dst = peer;
  e.chunk = m_device == 0 ? peer : m_device;
  e.op_seq = seq;
  e.train_step = m_comm.train_step();
  e.bytes = bytes;
  m_comm.gate(e);
  e.t_start = now_seconds();
  m_comm.transport().send(peer, data, bytes, seq);
  e.t_end = now_seconds();
  m_comm.add_bytes_sent(bytes);
  m_comm.record(e);
}

void DataParallelDevice::recv(int peer, void* data, size_t bytes, uint64_t seq) {
  m_comm.transport().recv(peer, data, bytes, seq);
}

// Runs one operation's transfers on this device and records its Collective event. Errors as the
// Communicator reports them: the world is aborted (peers fail at once) and a transport error is
// rethrown naming this device, the operation and the step.
template <class Body>
void DataParallelDevice::collective(const char* op, const char* what, uint64_t seq, uint64_t bytes, Body&& body) {
  Event whole;
  whole.kind = EventKind::Collective;
  whole.op = op;
  whole.what = what;
  whole.rank = m_device;
  whole.op_seq = seq;
  whole.train_step = m_comm.train_step();
  whole.bytes = bytes;
  whole.t_start = now_seconds();
  const std::string where = std::string(op) + " #" + std::to_string(seq) + " (" + what + ")" +
                            (whole.train_step >= 0 ? " at step " + std::to_string(whole.train_step) : "");
  try {
    body();
  } catch (const CommError& e) {
    const std::string detail = strip_rank(e.what(), m_device);
    m_comm.transport().abort(detail);
    throw CommError("rank " + std::to_string(m_device) + ": " + where + ": " + detail, e.hint());
  } catch (const std::exception& e) {
    m_comm.transport().abort(strip_rank(e.what(), m_device));
    throw;
  } catch (...) {
    m_comm.transport().abort("unknown exception in " + where);
    throw;
  }
  whole.t_end = now_seconds();
  m_comm.record(whole);
}

// Parameters then buffers (float, int64) in state_dict order: what replicate() copies.
std::vector<uint8_t> DataParallelDevice::pack_state() {
  m_model.to_host(kStateModel);  // a device's parameters and buffers (executor.h: residency)
  return StatePack(m_model, kPackParams | kPackBuffers).pack();
}

void DataParallelDevice::unpack_state(const std::vector<uint8_t>& in) {
  const StatePack pack(m_model, kPackParams | kPackBuffers);
  assert(in.size() == pack.bytes());
  pack.unpack(in.data());
  m_model.host_changed(kStateModel);
}

void DataParallelDevice::replicate_all() {
  const uint64_t seq = m_comm.next_seq();
  std::vector<uint8_t> state = pack_state();
  if (m_devices == 1) return;
  const uint64_t bytes = state.size();
  if (m_device == 0) {
    collective("replicate", "parameters and buffers", seq, bytes * static_cast<uint64_t>(m_devices - 1), [&] {
      for (int i = 1; i < m_devices; ++i)
        send(i, state.data(), bytes, seq, Phase::Broadcast, "replicate", "parameters and buffers");
    });
  } else {
    collective("replicate", "parameters and buffers", seq, bytes, [&] { recv(0, state.data(), bytes, seq); });
    unpack_state(state);
  }
}

DpStepResult DataParallelDevice::train_step(const Tensor& x, const std::vector<int>& labels, int64_t batch,
                                            const std::string& where, const std::function<void()>& before_backward) {
  DpStepResult r;
  r.chunks = torch_chunk_sizes(batch, m_devices);
  r.loss = std::numeric_limits<float>::quiet_NaN();
  const int used = static_cast<int>(r.chunks.size());
  std::vector<int64_t> off(static_cast<size_t>(used) + 1, 0);  // first sample of each chunk
  for (int i = 0; i < used; ++i) off[static_cast<size_t>(i) + 1] = off[static_cast<size_t>(i)] + r.chunks[static_cast<size_t>(i)];
  // Every device takes the iteration's five sequence numbers, used or idle.
  const uint64_t seq_scatter = m_comm.next_seq();
  const uint64_t seq_replicate = m_comm.next_seq();
  const uint64_t seq_gather = m_comm.next_seq();
  const uint64_t seq_grad_scatter = m_comm.next_seq();
  const uint64_t seq_reduce = m_comm.next_seq();
  if (m_device >= used) return r;  // torch.chunk gave fewer chunks than devices: idle
  const int64_t n = r.chunks[static_cast<size_t>(m_device)];
  r.my_chunk = n;
  const bool root = m_device == 0;
  auto chunk_of = [&](int i) { return static_cast<size_t>(r.chunks[static_cast<size_t>(i)]); };

  // 1. scatter the inputs. x: (B, 1, 28, 28) on device 0; m_x: (n, 1, 28, 28).
  m_x.resize({n, 1, 28, 28});
  const size_t sample_bytes = kSampleFloats * sizeof(float);
  if (root) {
    assert(x.numel() == batch * kSampleFloats && static_cast<int64_t>(labels.size()) == batch);
    collective("scatter", "inputs", seq_scatter, static_cast<uint64_t>(batch - n) * sample_bytes, [&] {
      for (int i = 1; i < used; ++i)
        send(i, x.ptr() + off[static_cast<size_t>(i)] * kSampleFloats, chunk_of(i) * sample_bytes, seq_scatter,
             Phase::Scatter, "scatter", "inputs");
    });
    std::memcpy(m_x.ptr(), x.ptr(), static_cast<size_t>(n) * sample_bytes);
  } else {
    collective("scatter", "inputs", seq_scatter, static_cast<uint64_t>(n) * sample_bytes,
               [&] { recv(0, m_x.ptr(), static_cast<size_t>(n) * sample_bytes, seq_scatter); });
  }

  // 2. replicate: parameters and buffers, device 0 -> every device with a chunk.
  std::vector<uint8_t> state = pack_state();
  if (mutated("dp-replicate-chain")) {
    // A lesson's mutation test (mutation.h): the copy travels device 0 -> 1 -> 2 -> ..., each
    // device passing it on, as a pipelined broadcast would; device 0 sends it once.
    const bool forward = m_device + 1 < used;
    collective("replicate", "parameters and buffers", seq_replicate,
               state.size() * static_cast<uint64_t>((root ? 0 : 1) + (forward ? 1 : 0)), [&] {
                 if (!root) recv(m_device - 1, state.data(), state.size(), seq_replicate);
                 if (forward)
                   send(m_device + 1, state.data(), state.size(), seq_replicate, Phase::Broadcast, "replicate",
                        "parameters and buffers");
               });
    if (!root) unpack_state(state);
  } else if (root) {
    collective("replicate", "parameters and buffers", seq_replicate, state.size() * static_cast<uint64_t>(used - 1), [&] {
      for (int i = 1; i < used; ++i)
        send(i, state.data(), state.size(), seq_replicate, Phase::Broadcast, "replicate", "parameters and buffers");
    });
  } else {
    collective("replicate", "parameters and buffers", seq_replicate, state.size(),
               [&] { recv(0, state.data(), state.size(), seq_replicate); });
    unpack_state(state);
  }

  // 3. forward on this replica's chunk.
  if (n == 1) {
    const std::string hint = "in replica " + std::to_string(m_device) + " on device " + std::to_string(m_device) +
                             " (PyTorch: \"Caught ValueError in replica " + std::to_string(m_device) + " on device " +
                             std::to_string(m_device) + ".\"): DataParallel split the batch of " +
                             std::to_string(batch) + " samples (" + where + ") over " + std::to_string(m_devices) +
                             " devices like torch.chunk into " + join_sizes(r.chunks) + ", so replica " +
                             std::to_string(m_device) + " got a single sample. Choose a batch size that leaves no " +
                             "chunk of one (--batch-size mod ceil(B/k) != 1), or --drop-last when it is the " +
                             "epoch's last, incomplete batch";
    for (BatchNorm* b : m_model.batchnorms()) b->set_error_hint(hint);
  }
  const int64_t step = m_comm.train_step();
  const Tensor& out = m_comm.timed(Phase::Forward, "forward", step,
                                   [&]() -> const Tensor& { return m_model.forward(m_x, Mode::Train); });  // (n, 10)

  // 4. gather the outputs on device 0; 5. the loss over the whole batch; 6. scatter dlogits.
  const size_t row_bytes = kClasses * sizeof(float);
  m_dlogits.resize({n, kClasses});
  if (root) {
    m_logits.resize({batch, kClasses});  // (B, 10)
    std::memcpy(m_logits.ptr(), out.ptr(), static_cast<size_t>(n) * row_bytes);
    collective("gather", "outputs", seq_gather, static_cast<uint64_t>(batch - n) * row_bytes, [&] {
      for (int i = 1; i < used; ++i)
        recv(i, m_logits.ptr() + off[static_cast<size_t>(i)] * kClasses, chunk_of(i) * row_bytes, seq_gather);
    });
    Tensor dfull;  // (B, 10)
    r.loss = cross_entropy(m_logits, labels, &dfull, &r.correct);
    collective("scatter", "output grads", seq_grad_scatter, static_cast<uint64_t>(batch - n) * row_bytes, [&] {
      for (int i = 1; i < used; ++i)
        send(i, dfull.ptr() + off[static_cast<size_t>(i)] * kClasses, chunk_of(i) * row_bytes, seq_grad_scatter,
             Phase::Scatter, "scatter", "output grads");
    });
    std::memcpy(m_dlogits.ptr(), dfull.ptr(), static_cast<size_t>(n) * row_bytes);
  } else {
    collective("gather", "outputs", seq_gather, static_cast<uint64_t>(n) * row_bytes, [&] {
      send(0, out.ptr(), static_cast<size_t>(n) * row_bytes, seq_gather, Phase::Gather, "gather", "outputs");
    });
    collective("scatter", "output grads", seq_grad_scatter, static_cast<uint64_t>(n) * row_bytes,
               [&] { recv(0, m_dlogits.ptr(), static_cast<size_t>(n) * row_bytes, seq_grad_scatter); });
  }

  // 7. backward on this replica.
  if (before_backward) before_backward();
  m_comm.timed(Phase::Backward, "backward", step, [&] {
    m_model.zero_grad();
    m_model.backward(m_dlogits);
  });

  // 8. reduce: the replicas' gradients into device 0's, in device order.
  std::vector<Param*> params = m_model.params();
  size_t total = 0;
  for (Param* p : params) total += p->grad.data.size();
  m_grads.resize(total);
  const size_t grad_bytes = total * sizeof(float);
  if (root) {
    collective("reduce", "gradients", seq_reduce, grad_bytes * static_cast<uint64_t>(used - 1), [&] {
      for (int i = 1; i < used; ++i) {
        recv(i, m_grads.data(), grad_bytes, seq_reduce);
        size_t o = 0;
        for (Param* p : params) {
          float* g = p->grad.data.data();
          const size_t count = p->grad.data.size();
          for (size_t k = 0; k < count; ++k) g[k] += m_grads[o + k];
          o += count;
        }
      }
    });
    // 9. the optimizer step, on device 0 only.
    m_comm.timed(Phase::OptimizerStep, "optimizer-step", step, [&] { m_opt.step(); });
  } else {
    size_t o = 0;
    for (Param* p : params) {
      std::memcpy(m_grads.data() + o, p->grad.data.data(), p->grad.data.size() * sizeof(float));
      o += p->grad.data.size();
    }
    collective("reduce", "gradients", seq_reduce, grad_bytes, [&] {
      send(0, m_grads.data(), grad_bytes, seq_reduce, Phase::Reduce, "reduce", "gradients");
    });
  }
  return r;
}

}  // namespace lab
