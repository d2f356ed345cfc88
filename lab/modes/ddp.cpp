#include "ddp.h"

#include <cassert>
#include <cstring>
#include <limits>

#include "mutation.h"
#include "state_pack.h"

namespace lab {

std::vector<std::vector<int>> compute_bucket_assignment(const std::vector<size_t>& param_bytes,
                                                        const std::vector<int>& order,
                                                        const std::vector<size_t>& limits) {
  assert(!limits.empty());
  std::vector<std::vector<int>> buckets;
  std::vector<int> current;
  size_t current_bytes = 0;
  size_t limit_index = 0;
  for (int i : order) {
    current.push_back(i);
    current_bytes += param_bytes[static_cast<size_t>(i)];
    if (current_bytes >= limits[limit_index]) {
      buckets.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
      if (limit_index + 1 < limits.size()) ++limit_index;
    }
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

DdpReducer::DdpReducer(Model& model, Communicator& comm, double bucket_cap_mb, BucketLaunch launch,
                       CommWorker* worker)
    : m_model(model), m_comm(comm), m_launch(launch), m_worker(worker), m_params(model.params()) {
  assert((launch != BucketLaunch::CommThread || worker) && "BucketLaunch::CommThread needs a CommWorker");
  m_cap_bytes = static_cast<size_t>(bucket_cap_mb * 1024.0 * 1024.0);
  // First iteration: one bucket with every parameter, in registration order (PyTorch passes
  // bucket_size_limits = [sys.maxsize] when find_unused_parameters is off).
  std::vector<int> all;
  for (size_t i = 0; i < m_params.size(); ++i) all.push_back(static_cast<int>(i));
  m_buckets = {all};
  m_bucket_of.assign(m_params.size(), 0);
}

void DdpReducer::restore_buckets(const std::vector<std::vector<int>>& buckets, bool rebuilt) {
  m_buckets = buckets;
  m_bucket_of.assign(m_params.size(), 0);
  for (size_t b = 0; b < m_buckets.size(); ++b)
    for (int i : m_buckets[b]) m_bucket_of[static_cast<size_t>(i)] = static_cast<int>(b);
  m_rebuilt = rebuilt;
}

DdpReducer::DeviceBucket& DdpReducer::DeviceBucket::operator=(DeviceBucket&& o) noexcept {
  std::swap(mem, o.mem);
  std::swap(data, o.data);
  std::swap(capacity, o.capacity);
  std::swap(count, o.count);
  return *this;
}

DdpReducer::DeviceBucket::~DeviceBucket() {
  if (mem && data) mem->release(data);
}

void DdpReducer::DeviceBucket::resize(DeviceMemory& m, size_t n) {
  if (n > capacity || mem != &m) {
    if (mem && data) mem->release(data);
    mem = &m;
    data = static_cast<float*>(m.allocate(n * sizeof(float)));
    capacity = n;
  }
  count = n;
}

size_t DdpReducer::bucket_size(size_t b) const {
  size_t total = 0;
  for (int i : m_buckets[b]) total += m_params[static_cast<size_t>(i)]->grad.data.size();
  return total;
}

void DdpReducer::place() {
  if (m_placed) return;
  m_placed = true;
  ModelExecutor* e = m_model.executor();
  DeviceMemory* mem = e ? e->device_memory() : nullptr;
  if (mem && m_comm.allreduce_on_device() && e->keep_grads(true)) m_mem = mem;
}

void DdpReducer::set_divide_in_hook(bool on) { m_divide = on; }

void DdpReducer::prepare_for_backward() {
  place();
  m_pending.assign(m_buckets.size(), 0);
  for (size_t b = 0; b < m_buckets.size(); ++b) m_pending[b] = static_cast<int>(m_buckets[b].size());
  m_ready.assign(m_params.size(), 0);
  m_next_bucket = 0;
  if (m_mem)
    m_dflat.resize(m_buckets.size());
  else
    m_flat.resize(m_buckets.size());
  if (!m_rebuilt) m_ready_order.clear();
  m_launch_unfinished = m_launch == BucketLaunch::CommThread && mutated("ddp-launch-unfinished-bucket");
}

void DdpReducer::mark_param_ready(int i) {
  assert(!m_ready[static_cast<size_t>(i)] && "gradient marked ready twice");
  m_ready[static_cast<size_t>(i)] = 1;
  if (!m_rebuilt) m_ready_order.push_back(i);
  int& pending = m_pending[static_cast<size_t>(m_bucket_of[static_cast<size_t>(i)])];
  // The mutation ddp-launch-unfinished-bucket (mutation.h) launches a bucket at its first ready
  // gradient: copy_in then takes the others as they are before backward has computed them.
  pending = m_launch_unfinished ? 0 : pending - 1;
  // Buckets are launched in index order: a ready bucket waits for all earlier ones.
  while (m_next_bucket < m_buckets.size() && m_pending[m_next_bucket] == 0) launch_bucket(m_next_bucket++);
}

void DdpReducer::launch_bucket(size_t b) {
  switch (m_launch) {
    case BucketLaunch::InHook:
      copy_in(b);
      allreduce_bucket(b);
      copy_out(b);
      break;
    case BucketLaunch::CommThread:
      // The gradients of a ready bucket are final: the rank thread copies them now (as DDP's
      // autograd hook does) and the worker only touches the bucket's own buffer.
      copy_in(b);
      m_worker->submit([this, b] { allreduce_bucket(b); });
      break;
    case BucketLaunch::AfterBackward:
      break;  // finalize_backward launches every bucket
  }
}

// Bucket b's gradients into m_flat[b], each multiplied by 1/world_size as DDP does while copying
// (or, with a communication hook, divided by world_size).
void DdpReducer::copy_in(size_t b) {
  const int world = m_comm.world_size();
  const float scale = static_cast<float>(1.0 / world);  // PyTorch multiplies by 1/world_size
  const float divisor = static_cast<float>(world);
  const size_t total = bucket_size(b);
  if (m_mem) {  // on the device: copied (or, kept on the host, uploaded) into the bucket, scaled there
    DeviceBucket& d = m_dflat[b];
    d.resize(*m_mem, total);
    size_t off = 0;
    for (int i : m_buckets[b]) {
      const Tensor& g = m_params[static_cast<size_t>(i)]->grad;
      const size_t n = g.data.size();
      if (const float* dg = m_model.device_grad(static_cast<size_t>(i)))
        m_mem->copy(d.data + off, dg, n * sizeof(float));
      else
        m_mem->upload(d.data + off, g.data.data(), n * sizeof(float));
      if (m_divide)
        m_mem->divide(d.data + off, divisor, n);
      else
        m_mem->scale(d.data + off, scale, n);
      off += n;
    }
    return;
  }
  std::vector<float>& flat = m_flat[b];
  flat.resize(total);
  size_t off = 0;
  for (int i : m_buckets[b]) {
    const Tensor& g = m_params[static_cast<size_t>(i)]->grad;
    if (m_divide)
      for (size_t k = 0; k < g.data.size(); ++k) flat[off + k] = g.data[k] / divisor;
    else
      for (size_t k = 0; k < g.data.size(); ++k) flat[off + k] = g.data[k] * scale;
    off += g.data.size();
  }
}

void DdpReducer::allreduce_bucket(size_t b) {
  if (m_mem) {
    m_comm.allreduce_sum(m_dflat[b].data, m_dflat[b].count, CollectiveInfo{"grad bucket", static_cast<int>(b)}, m_mem);
    return;
  }
  m_comm.allreduce_sum(m_flat[b].data(), m_flat[b].size(), CollectiveInfo{"grad bucket", static_cast<int>(b)});
}

void DdpReducer::copy_out(size_t b) {
  size_t off = 0;
  if (m_mem) {
    for (int i : m_buckets[b]) {
      Tensor& g = m_params[static_cast<size_t>(i)]->grad;
      const size_t n = g.data.size();
      if (float* dg = m_model.device_grad(static_cast<size_t>(i)))
        m_mem->copy(dg, m_dflat[b].data + off, n * sizeof(float));
      else
        m_mem->download(g.data.data(), m_dflat[b].data + off, n * sizeof(float));
      off += n;
    }
    return;
  }
  for (int i : m_buckets[b]) {
    Tensor& g = m_params[static_cast<size_t>(i)]->grad;
    std::memcpy(g.data.data(), m_flat[b].data() + off, g.data.size() * sizeof(float));
    off += g.data.size();
  }
}

void DdpReducer::finalize_backward() {
  assert(m_next_bucket == m_buckets.size() && "a bucket was never reduced: a parameter got no gradient");
  if (m_launch == BucketLaunch::CommThread) {
    m_worker->wait_idle();
    for (size_t b = 0; b < m_buckets.size(); ++b) copy_out(b);
  } else if (m_launch == BucketLaunch::AfterBackward) {
    for (size_t b = 0; b < m_buckets.size(); ++b) {
      copy_in(b);
      allreduce_bucket(b);
      copy_out(b);
    }
  }
  if (m_rebuilt) return;
  // Reducer::rebuild_buckets: gradient-ready order, first bucket 1 MiB, then bucket_cap_mb.
  std::vector<size_t> bytes;
  for (Param* p : m_params) bytes.push_back(p->value.data.size() * sizeof(float));
  m_buckets = compute_bucket_assignment(bytes, m_ready_order, {kDefaultFirstBucketBytes, m_cap_bytes});
  for (size_t b = 0; b < m_buckets.size(); ++b)
    for (int i : m_buckets[b]) m_bucket_of[static_cast<size_t>(i)] = static_cast<int>(b);
  m_rebuilt = true;
}

void DdpReducer::allreduce_zero_buckets() {
  place();
  for (size_t b = 0; b < m_buckets.size(); ++b) {
    const size_t total = bucket_size(b);
    std::vector<float> zeros(total, 0.0f);
    if (m_mem) {  // the other ranks' buckets are device memory: so is this one
      DeviceBucket d;
      d.resize(*m_mem, total);
      m_mem->upload(d.data, zeros.data(), total * sizeof(float));
      m_comm.allreduce_sum(d.data, total, CollectiveInfo{"grad bucket", static_cast<int>(b)}, m_mem);
      continue;
    }
    m_comm.allreduce_sum(zeros.data(), total, CollectiveInfo{"grad bucket", static_cast<int>(b)});
  }
}

// On a device that keeps BatchNorm's buffers (executor.h: residency) they are staged: the root's
// come down, the others' go up (a few bytes per channel).
void broadcast_buffers(Model& model, Communicator& comm, int root) {
  // (one rank sends to nobody: a device's buffers need not come down for it)
  if (comm.rank() == root && comm.world_size() > 1) model.to_host(kStateBuffers);
  const StatePack pack(model, kPackBuffers);
  if (pack.bytes() == 0) return;
  std::vector<uint8_t> bytes = pack.pack();
  comm.broadcast(bytes.data(), bytes.size(), root, CollectiveInfo{"buffers", -1});
  if (comm.rank() != root) {
    pack.unpack(bytes.data());
    model.host_changed(kStateBuffers);
  }
}

void broadcast_state(Model& model, Communicator& comm, int root) {
  // PyTorch coalesces the module states into 250 MB buckets; ours fit in one.
  std::vector<float> flat;
  model.to_host(kStateParams);  // a device's parameters (executor.h: residency)
  for (Param* p : model.params()) flat.insert(flat.end(), p->value.data.begin(), p->value.data.end());
  comm.broadcast(flat.data(), flat.size() * sizeof(float), root, CollectiveInfo{"parameters", -1});
  if (comm.rank() != root) {
    size_t off = 0;
    for (Param* p : model.params()) {
      std::memcpy(p->value.data.data(), flat.data() + off, p->value.data.size() * sizeof(float));
      off += p->value.data.size();
    }
    model.host_changed(kStateParams);
  }
  broadcast_buffers(model, comm, root);
}

}  // namespace lab
