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
//
// Ranks as processes (compiled with NCCL_MODEL_PROCESSES, for test_nccl_processes.cpp under
// mpirun): each process holds one rank of a communicator, rank r being MPI's rank r, and what
// crosses processes travels over MPI (an MPI_Comm_dup of MPI_COMM_WORLD made at init): a send or
// receive is an MPI_Isend / MPI_Irecv (MPI keeps their order per pair, as NCCL does; a size
// mismatch is MPI's truncation error, not a wait), ncclAllReduce an MPI_Iallgather summed in rank
// order, and two processes of one "machine" (the same MPI processor name) on one GPU fail init
// with "Duplicate GPU detected". Requests are tested by cudaStreamQuery and ncclCommGetAsyncError.
// Every MPI call is made under the MpiRuntime's mutex, as dtlab's own MPI calls are.
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
#ifdef NCCL_MODEL_PROCESSES
#include <mpi.h>

#include "mpi/mpi_runtime.h"
#endif

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
#ifdef NCCL_MODEL_PROCESSES
  MPI_Comm mpi = MPI_COMM_NULL;
#endif
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

#ifdef NCCL_MODEL_PROCESSES
// An operation in flight over MPI: a part of a send/recv group, or an allreduce's allgather.
struct MpiPending {
  ncclComm* comm;
  MPI_Request req;
  std::shared_ptr<Op> op;
  bool recv = false;
  int n = 0;                       // ranks of the communicator
  float* ar_buf = nullptr;         // allreduce: the caller's buffer
  size_t ar_count = 0;
  std::vector<float> ar_gathered;  // allreduce: every rank's values, rank after rank
};
std::deque<MpiPending> g_mpi;  // under g_mu

std::mutex& mpi_mu() { return lab::MpiRuntime::current()->mpi_mutex(); }

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  std::fprintf(stderr, "nccl model: %s failed (%d)\n", what, rc);
  std::abort();
}

// Tests every request in flight; a finished one finishes its op (g_mu held).
void progress_mpi_locked() {
  std::lock_guard<std::mutex> lock(mpi_mu());
  for (auto it = g_mpi.begin(); it != g_mpi.end();) {
    int done = 0;
    mpi_check(MPI_Test(&it->req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (!done) {
      ++it;
      continue;
    }
    if (it->ar_buf && !it->op->ended) {
      const int n = it->n;
      for (size_t i = 0; i < it->ar_count; ++i) {
        float sum = it->ar_gathered[i];
        for (int r = 1; r < n; ++r) sum = sum + it->ar_gathered[static_cast<size_t>(r) * it->ar_count + i];
        it->ar_buf[i] = sum;
      }
    }
    --it->op->pending;
    it = g_mpi.erase(it);
  }
}

// The part's half over MPI (g_mu held).
void post_part_mpi(Part p) {
  std::lock_guard<std::mutex> lock(mpi_mu());
  MpiPending m{p.comm, MPI_REQUEST_NULL, p.op, !p.send, p.comm->n, nullptr, 0, {}};
  const int count = static_cast<int>(p.bytes);
  if (p.send)
    mpi_check(MPI_Isend(p.buf, count, MPI_BYTE, p.peer, 0, p.comm->mpi, &m.req), "MPI_Isend");
  else
    mpi_check(MPI_Irecv(p.buf, count, MPI_BYTE, p.peer, 0, p.comm->mpi, &m.req), "MPI_Irecv");
  g_mpi.push_back(std::move(m));
}

// Process-mode inits: the communicator's own MPI communicator, and NCCL's duplicate-GPU refusal
// between the processes of one machine (g_mu held; every process of the job calls this at once).
void init_process_comm(ncclComm* c) {
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_rank != c->rank || world_size != c->n) {
    std::fprintf(stderr, "nccl model: rank %d of %d is MPI's rank %d of %d\n", c->rank, c->n, world_rank, world_size);
    std::abort();
  }
  std::lock_guard<std::mutex> lock(mpi_mu());
  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi), "MPI_Comm_dup");
  struct Where {
    char host[MPI_MAX_PROCESSOR_NAME + 1];
    int device;
  } me{}, all_init{};
  int len = 0;
  MPI_Get_processor_name(me.host, &len);
  me.device = c->device;
  std::vector<Where> all(static_cast<size_t>(c->n), all_init);
  mpi_check(MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, c->mpi), "MPI_Allgather");
  for (int r = 0; r < c->n; ++r) {
    const Where& w = all[static_cast<size_t>(r)];
    if (r != c->rank && w.device == me.device && std::strcmp(w.host, me.host) == 0) {
      c->state = ncclInvalidUsage;
      g_last_error = "Duplicate GPU detected : rank " + std::to_string(c->rank) + " and rank " + std::to_string(r) +
                     " both on CUDA device " + std::to_string(me.device);
      return;
    }
  }
  c->polls_in_progress = 3;
}
#endif

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

[[maybe_unused]] void post_part(Part p) {
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
#ifdef NCCL_MODEL_PROCESSES
    init_process_comm(c);
    ret = ncclInProgress;
    continue;
#endif
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
#ifdef NCCL_MODEL_PROCESSES
    post_part_mpi(p);
#else
    post_part(p);
#endif
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
#ifdef NCCL_MODEL_PROCESSES
  progress_mpi_locked();
#endif
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
#ifdef NCCL_MODEL_PROCESSES
  progress_mpi_locked();
#endif
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
  c->state = ncclInProgress;
  c->polls_in_progress = 2;
#ifdef NCCL_MODEL_PROCESSES
  {
    std::lock_guard<std::mutex> mlock(mpi_mu());
    MpiPending m{c, MPI_REQUEST_NULL, op, false, c->n, static_cast<float*>(rbuf), count,
                 std::vector<float>(count * static_cast<size_t>(c->n))};
    mpi_check(MPI_Iallgather(rbuf, static_cast<int>(count), MPI_FLOAT, m.ar_gathered.data(), static_cast<int>(count),
                             MPI_FLOAT, c->mpi, &m.req),
              "MPI_Iallgather");
    g_mpi.push_back(std::move(m));
  }
  return ncclInProgress;
#endif
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
  return ncclInProgress;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(g_mu);
  check(c);
  for (auto& op : c->ops) op->ended = true;
#ifdef NCCL_MODEL_PROCESSES
  // Receives in flight are cancelled, sends are left to MPI; an allgather cannot be cancelled or
  // freed (MPI forbids both), so it stays in the list with its buffer, and the job cannot end
  // cleanly (the tests abort outside allreduces).
  {
    std::lock_guard<std::mutex> mlock(mpi_mu());
    for (auto it = g_mpi.begin(); it != g_mpi.end();) {
      if (it->comm != c || it->ar_buf) {
        ++it;
        continue;
      }
      if (it->recv) {
        MPI_Cancel(&it->req);
        MPI_Wait(&it->req, MPI_STATUS_IGNORE);
      } else {
        MPI_Request_free(&it->req);
      }
      it = g_mpi.erase(it);
    }
    MPI_Comm_free(&c->mpi);
  }
#endif
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
#ifdef NCCL_MODEL_PROCESSES
  {
    std::lock_guard<std::mutex> mlock(mpi_mu());
    MPI_Comm_free(&c->mpi);
  }
#endif
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
