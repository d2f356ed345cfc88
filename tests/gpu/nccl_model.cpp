// A CPU model of the CUDA runtime and NCCL calls that backends/nccl/transport_nccl.cpp makes, linked
// in their place so that the transport's own logic (staging, polling non-blocking communicators,
// aborts from any thread, timeouts, teardown) runs in CI without a GPU: tests/gpu/test_nccl.cpp and
// test_nccl_model.cpp against it (executable dtlab_nccl_model_tests, label nccl-model).
//
// What it models: "device memory" is host memory; NCCL_MODEL_GPUS (default 2) GPUs; p2p sends and
// receives match first-in first-out per (src, dst) once both sides are posted in a group;
// ncclAllReduce sums in rank order once every rank has posted; non-blocking communicators report
// ncclInProgress for a few polls after every init and group; two ranks of one communicator on one
// GPU fail init with ncclInvalidUsage and "Duplicate GPU detected", as NCCL 2.28 does; an abort
// ends the communicator's pending operations. What it checks of the caller (and aborts the
// process on): a blocking communicator, an init outside a group, a communicator used after it was
// freed, a send on a communicator still in progress, a copy queued behind a pending NCCL
// operation (on a real GPU a copy to pageable memory would block the host there).
// What it is not: NCCL. Timing, the wire, NCCL's own errors and hangs are tested on GPUs only
// (tests/gpu under tools/gpu_check.sh).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda_device.h"

namespace {
std::mutex g_mu;
int g_devices() {
  const char* e = std::getenv("NCCL_MODEL_GPUS");
  return e ? std::atoi(e) : 2;
}
thread_local int t_device = 0;
std::string g_last_error;
int g_next_clique = 1;

struct Op {
  int pending = 0;
  bool ended = false;  // aborted
};
}  // namespace

struct CUstream_st {
  int device = 0;
  std::shared_ptr<Op> last;
};

namespace {
constexpr unsigned kMagic = 0xC0FFEE;
struct Clique;
}  // namespace

struct ncclComm {
  unsigned magic = kMagic;
  int rank = 0, n = 0, device = 0;
  Clique* clique = nullptr;
  ncclResult_t state = ncclInProgress;
  int polls_in_progress = 0;
  bool ready_after_group = false;
  std::vector<std::shared_ptr<Op>> ops;
  uint64_t ar_seq = 0;
};

namespace {

struct Part {
  ncclComm* comm;
  bool send;
  int peer;
  void* buf;
  size_t bytes;
  cudaStream_t stream;
  std::shared_ptr<Op> op;
};

struct ArPost {
  ncclComm* comm;
  float* buf;
  size_t count;
  std::shared_ptr<Op> op;
};

struct Clique {
  int n = 0;
  std::vector<ncclComm*> comms;
  std::map<std::pair<int, int>, std::deque<Part>> sends, recvs;  // (src, dst)
  std::map<uint64_t, std::vector<ArPost>> allreduce;
};
std::map<int, Clique*> g_cliques;

void check(ncclComm* c) {
  if (c == nullptr || c->magic != kMagic) {
    std::fprintf(stderr, "nccl model: use of a freed or invalid communicator %p\n", static_cast<void*>(c));
    std::abort();
  }
}

thread_local int t_group = 0;
thread_local std::vector<Part> t_parts;
thread_local std::vector<ncclComm*> t_inits;

void finish_part(Part& p) { --p.op->pending; }

void post_part(Part p) {
  Clique* q = p.comm->clique;
  const int me = p.comm->rank;
  if (p.send) {
    auto& rq = q->recvs[{me, p.peer}];
    if (!rq.empty() && rq.front().bytes == p.bytes) {
      Part r = rq.front();
      rq.pop_front();
      if (p.bytes) std::memcpy(r.buf, p.buf, p.bytes);
      finish_part(r);
      finish_part(p);
      return;
    }
    q->sends[{me, p.peer}].push_back(p);
  } else {
    auto& sq = q->sends[{p.peer, me}];
    if (!sq.empty() && sq.front().bytes == p.bytes) {
      Part s = sq.front();
      sq.pop_front();
      if (p.bytes) std::memcpy(p.buf, s.buf, p.bytes);
      finish_part(s);
      finish_part(p);
      return;
    }
    q->recvs[{p.peer, me}].push_back(p);
  }
}

ncclResult_t end_group_locked() {
  // inits
  ncclResult_t ret = ncclSuccess;
  for (ncclComm* c : t_inits) {
    Clique* q = c->clique;
    int joined = 0;
    for (ncclComm* o : q->comms) joined += o != nullptr;
    if (joined == q->n) {
      std::set<int> devs;
      bool dup = false;
      for (ncclComm* o : q->comms) dup = !devs.insert(o->device).second || dup;
      for (ncclComm* o : q->comms) {
        if (dup) {
          o->state = ncclInvalidUsage;
          g_last_error = "Duplicate GPU detected : rank " + std::to_string(o->rank) + " and rank 0 both on CUDA device " +
                         std::to_string(o->device);
        } else {
          o->polls_in_progress = 3;
        }
      }
    }
    ret = ncclInProgress;
  }
  t_inits.clear();
  // ops: one Op per stream
  std::map<cudaStream_t, std::shared_ptr<Op>> ops;
  for (Part& p : t_parts) {
    auto& op = ops[p.stream];
    if (!op) op = std::make_shared<Op>();
    op->pending++;
    p.op = op;
  }
  for (auto& [s, op] : ops) s->last = op;
  std::vector<Part> parts = std::move(t_parts);
  t_parts.clear();
  for (Part& p : parts) {
    p.comm->ops.push_back(p.op);
    p.comm->polls_in_progress = 2;
    p.comm->state = ncclInProgress;
    post_part(p);
    ret = ncclInProgress;
  }
  return ret;
}

}  // namespace

extern "C" {

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorModel"; }
const char* cudaGetErrorString(cudaError_t) { return "error in the CUDA model"; }
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= g_devices()) return cudaErrorInvalidDevice;
  t_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = t_device;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = new CUstream_st;
  (*s)->device = t_device;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (s->last && s->last->pending > 0 && !s->last->ended) {
    std::fprintf(stderr, "nccl model: cudaMemcpyAsync queued behind a pending NCCL op (would block)\n");
    std::abort();
  }
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (s->last && s->last->pending > 0 && !s->last->ended) return cudaErrorNotReady;
  return cudaSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "some nccl error";
  }
}
const char* ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::memset(id, 0, sizeof *id);
  int k = g_next_clique++;
  std::memcpy(id->internal, &k, sizeof k);
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  ++t_group;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (--t_group > 0) return ncclSuccess;
  std::lock_guard<std::mutex> lock(g_mu);
  return end_group_locked();
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (config->blocking != 0) {
    std::fprintf(stderr, "nccl model: blocking communicator\n");
    std::abort();
  }
  std::lock_guard<std::mutex> lock(g_mu);
  int k;
  std::memcpy(&k, id.internal, sizeof k);
  Clique*& q = g_cliques[k];
  if (!q) {
    q = new Clique;
    q->n = nranks;
    q->comms.assign(nranks, nullptr);
  }
  auto* c = new ncclComm;
  c->rank = rank;
  c->n = nranks;
  c->device = t_device;
  c->clique = q;
  q->comms[rank] = c;
  *comm = c;
  if (t_group == 0) {
    std::fprintf(stderr, "nccl model: init outside a group\n");
    std::abort();
  }
  t_inits.push_back(c);
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* state) {
  std::lock_guard<std::mutex> lock(g_mu);
  check(c);
  if (c->state == ncclInProgress && c->polls_in_progress > 0 && --c->polls_in_progress == 0) c->state = ncclSuccess;
  *state = c->state;
  return ncclSuccess;
}
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    check(c);
    if (c->state != ncclSuccess) {
      std::fprintf(stderr, "nccl model: ncclSend while the communicator is not ncclSuccess\n");
      std::abort();
    }
  }
  if (t_group == 0) {
    ncclGroupStart();
    ncclSend(buf, count, ncclUint8, peer, c, s);
    return ncclGroupEnd();
  }
  t_parts.push_back(Part{c, true, peer, const_cast<void*>(buf), count, s, nullptr});
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    check(c);
  }
  if (t_group == 0) {
    ncclGroupStart();
    ncclRecv(buf, count, ncclUint8, peer, c, s);
    return ncclGroupEnd();
  }
  t_parts.push_back(Part{c, false, peer, buf, count, s, nullptr});
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void* sbuf, void* rbuf, size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t c,
                           cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  check(c);
  if (sbuf != rbuf) std::abort();
  auto op = std::make_shared<Op>();
  op->pending = 1;
  s->last = op;
  c->ops.push_back(op);
  auto& posts = c->clique->allreduce[c->ar_seq++];
  posts.push_back(ArPost{c, static_cast<float*>(rbuf), count, op});
  if (static_cast<int>(posts.size()) == c->n) {
    std::vector<float> sum(count, 0.0f);
    std::vector<ArPost*> byrank(c->n);
    for (auto& p : posts) byrank[p.comm->rank] = &p;
    for (int r = 0; r < c->n; ++r)
      for (size_t i = 0; i < count; ++i) sum[i] = r == 0 ? byrank[r]->buf[i] : sum[i] + byrank[r]->buf[i];
    for (auto& p : posts) {
      std::memcpy(p.buf, sum.data(), count * sizeof(float));
      p.op->pending = 0;
    }
  }
  c->state = ncclInProgress;
  c->polls_in_progress = 2;
  return ncclInProgress;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(g_mu);
  check(c);
  for (auto& op : c->ops) op->ended = true;
  // unmatched parts of this comm leave the queues
  for (auto* m : {&c->clique->sends, &c->clique->recvs})
    for (auto& [k, dq] : *m)
      for (auto it = dq.begin(); it != dq.end();) it = it->comm == c ? dq.erase(it) : it + 1;
  c->clique->comms[c->rank] = nullptr;
  c->magic = 0;
  delete c;
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(g_mu);
  check(c);
  c->state = ncclInProgress;
  c->polls_in_progress = 2;
  return ncclInProgress;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(g_mu);
  check(c);
  c->clique->comms[c->rank] = nullptr;
  c->magic = 0;
  delete c;
  return ncclSuccess;
}

}  // extern "C"

namespace lab::cuda {
CudaProbe cuda_devices() {
  CudaProbe p;
  for (int i = 0; i < g_devices(); ++i) {
    CudaDeviceInfo d;
    d.index = i;
    d.name = "model GPU";
    p.devices.push_back(d);
  }
  if (p.devices.empty()) p.reason = "NCCL_MODEL_GPUS=0: no GPUs";
  return p;
}
}  // namespace lab::cuda
