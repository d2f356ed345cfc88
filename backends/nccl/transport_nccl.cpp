// Ranks on GPUs over NCCL: see transport_nccl.h for what is supported.
//
// Sections: errors (CUDA and NCCL calls as DeviceError) | staging buffers | TransportNccl: the
// calls, enqueueing, waiting and giving up | NcclWorld: start (one group of non-blocking inits)
// and teardown (finalize, or abort after a failure).
//
// Locking. A rank's communicator is used by the rank's thread, but abort() may come from any
// thread (Run's destructor aborts every rank) and ncclCommAbort frees the communicator. So every
// NCCL call on it is made under the rank's comm_mu, and abort sets the handle to null under the
// same lock; a call that finds it null has been aborted. The lock is held only while NCCL
// enqueues or reports its state, never while waiting.
//
// Errors. This file reports CUDA and NCCL failures itself instead of through
// backends/cuda/cuda_error.h: that file's .cpp also reports cuBLAS and cuDNN errors, so linking
// it would make the dtlab executable (which holds this transport) load cuBLAS at start.
#include "transport_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device_memory.h"
#include "errors.h"
#include "events.h"

namespace lab {

namespace {

// Waiting: poll without pause for kSpinSeconds (an NCCL step of small messages takes 10-50 us),
// then yield until kYieldSeconds, then sleep kSleep per round (many ranks, few cores).
constexpr double kSpinSeconds = 100e-6;
constexpr double kYieldSeconds = 2e-3;
constexpr std::chrono::microseconds kSleep{50};
// Staging buffers grow in steps of this many bytes, so that ring chunks one float apart in size
// share an allocation.
constexpr size_t kStagingGrain = size_t{64} << 10;


// ---- errors ----

// "cudaMalloc failed: cudaErrorMemoryAllocation (out of memory)", with what to check.
[[noreturn]] void throw_cuda(cudaError_t e, const std::string& call) {
  cudaGetLastError();  // consumes a non-sticky error
  std::string hint = "set CUDA_LAUNCH_BLOCKING=1 to see an asynchronous error at the call that caused it";
  if (e == cudaErrorMemoryAllocation)
    hint = "the GPU is out of memory for NCCL's staging buffers: see with `nvidia-smi` which process holds it";
  else if (e == cudaErrorInvalidDevice || e == cudaErrorNoDevice)
    hint = "no such GPU: check `nvidia-smi` and CUDA_VISIBLE_DEVICES";
  else if (e == cudaErrorInsufficientDriver)
    hint = "no NVIDIA driver, or one older than this build's CUDA runtime: check `nvidia-smi`";
  throw DeviceError(call + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")", hint);
}

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw_cuda(e, call);
}

// cudaSetDevice(device), failing as "cudaSetDevice(3) failed: ...".
void set_device(int device) {
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) throw_cuda(e, "cudaSetDevice(" + std::to_string(device) + ")");
}

// "ncclCommInitRankConfig failed: invalid usage (run with NCCL_DEBUG=WARN for details): Duplicate
// GPU detected : rank 1 and rank 0 both on CUDA device 1000", with what to check.
[[noreturn]] void throw_nccl(ncclResult_t r, const std::string& call, const std::string& context = "") {
  std::string status = ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') status += std::string(": ") + last;
  std::string hint = "NCCL_DEBUG=INFO says more";
  if (r == ncclInvalidUsage || r == ncclInvalidArgument)
    hint = "NCCL refused the call; NCCL 2.28 refuses two ranks of one communicator on the same GPU (\"Duplicate "
           "GPU\"): use one rank per GPU, or --comm threads for ranks that share one. NCCL_DEBUG=WARN says more";
  else if (r == ncclRemoteError)
    hint = "a peer rank failed or went away";
  else if (r == ncclSystemError)
    hint = "a system call failed (shared memory, sockets): NCCL_DEBUG=INFO says which";
  else if (r == ncclUnhandledCudaError)
    hint = "a CUDA call inside NCCL failed and the GPU may be unusable now: NCCL_DEBUG=WARN says which";
  throw DeviceError(context + call + " failed: " + status, hint);
}

// A non-blocking communicator answers ncclInProgress while it works in the background.
bool nccl_ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

// ---- staging buffers ----

// Device memory of one rank, grown on demand in kStagingGrain steps, never shrunk. The owner
// frees it with its GPU current.
struct Staging {
  void* ptr = nullptr;
  size_t capacity = 0;  // bytes
  void* reserve(size_t bytes) {
    if (bytes > capacity) {
      release();
      const size_t want = (bytes + kStagingGrain - 1) / kStagingGrain * kStagingGrain;
      check_cuda(cudaMalloc(&ptr, want), "cudaMalloc (NCCL staging buffer)");
      capacity = want;
    }
    return ptr;
  }
  void release() {
    if (ptr != nullptr) cudaFree(ptr);  // a failure here shows at the next call
    ptr = nullptr;
    capacity = 0;
  }
};

// The caller's current GPU, restored when this goes out of scope (the world's constructor and
// destructor switch GPUs on the caller's thread).
struct KeepCurrentDevice {
  int device = -1;
  KeepCurrentDevice() {
    if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  }
  ~KeepCurrentDevice() {
    if (device >= 0) cudaSetDevice(device);
  }
};

// What a blocked call is about, for its messages.
struct Site {
  std::string what;    // "recv from rank 1"
  std::string waits;   // "rank 1", "rank 2 or rank 0", "the other ranks"
  std::string detail;  // "ncclRecv of 4096 bytes, tag 7"
};

}  // namespace

class TransportNccl;

struct NcclWorldState {
  int n = 0;
  int first_rank = 0;  // transports[k] is rank first_rank + k
  double timeout_s = 0;  // for init and for finalize at teardown
  std::vector<std::unique_ptr<TransportNccl>> transports;
  // Ranks as processes: the launcher's runtime, which carries aborts between the processes (null:
  // every rank is in this process).
  ProcessGroup* group = nullptr;

  bool started = false;  // every communicator initialized (else teardown aborts them)
  std::atomic<bool> aborted{false};
  mutable std::mutex abort_mu;
  std::string abort_reason;  // the first abort, "rank A failed: <reason>"

  ~NcclWorldState();
};

class TransportNccl final : public Transport {
 public:
  // Creates the rank's stream on `device`; the world hands it its communicator once started.
  TransportNccl(NcclWorldState& w, int rank, int device) : m_w(w), m_rank(rank), m_device(device) {
    m_timeout = w.timeout_s;
    set_device(device);
    check_cuda(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }

  // The communicator is gone by now (NcclWorldState's destructor); frees the stream and buffers.
  ~TransportNccl() override {
    if (cudaSetDevice(m_device) != cudaSuccess) return;  // the driver is gone: so are the resources
    m_send.release();
    m_recv.release();
    if (m_stream != nullptr) cudaStreamDestroy(m_stream);
  }

  int rank() const override { return m_rank; }
  int world_size() const override { return m_w.n; }
  const char* name() const override { return "nccl"; }

  void send(int dst, const void* buf, size_t bytes, uint64_t tag) override {
    check_peer(dst, "send");
    p2p("send", dst, buf, bytes, -1, nullptr, 0, tag);
  }

  void recv(int src, void* buf, size_t bytes, uint64_t tag) override {
    check_peer(src, "recv");
    p2p("recv", -1, nullptr, 0, src, buf, bytes, tag);
  }

  void sendrecv(int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                uint64_t tag) override {
    check_peer(dst, "sendrecv");
    check_peer(src, "sendrecv");
    p2p("sendrecv", dst, sbuf, sbytes, src, rbuf, rbytes, tag);
  }

  // Device buffers (lab/comm/device_memory.h): NCCL sends from and receives into them where they
  // are, no staging; the ring's reduction is the device's own add.
  bool device_aware() const override { return true; }
  bool native_on_device() const override { return true; }

  void sendrecv_on(DeviceMemory&, int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                   uint64_t tag) override {
    check_peer(dst, "sendrecv");
    check_peer(src, "sendrecv");
    p2p("sendrecv", dst, sbuf, sbytes, src, rbuf, rbytes, tag, /*on_device=*/true);
  }

  void sendrecv_reduce_on(DeviceMemory& mem, int dst, const float* sbuf, size_t scount, int src, float* acc,
                          size_t rcount, uint64_t tag) override {
    check_peer(dst, "sendrecv_reduce");
    check_peer(src, "sendrecv_reduce");
    const size_t rbytes = rcount * sizeof(float);
    void* in = nullptr;
    call({"sendrecv_reduce", "rank " + std::to_string(src), "its receive buffer"},
         [&] { in = rbytes > 0 ? m_recv.reserve(rbytes) : nullptr; });
    p2p("sendrecv_reduce", dst, sbuf, scount * sizeof(float), src, in, rbytes, tag, /*on_device=*/true);
    if (rcount > 0) mem.add(acc, static_cast<const float*>(in), rcount);  // after NCCL's stream is done with it
  }

  // ncclAllReduce (float32, sum) in place on device memory.
  void native_allreduce_sum_on(DeviceMemory&, float* data, size_t count) override {
    const Site site{"native allreduce", "the other ranks",
                    "ncclAllReduce of " + std::to_string(count) + " floats in device memory"};
    call(site, [&] {
      if (count == 0) return;
      enqueue(site, "ncclAllReduce", [&](ncclComm_t c) {
        return ncclAllReduce(data, data, count, ncclFloat, ncclSum, c, m_stream);
      });
      wait_done(site);
    });
  }

  // ncclAllReduce (float32, sum) in place on the staged copy of data (count floats).
  void native_allreduce_sum(float* data, size_t count) override {
    const size_t bytes = count * sizeof(float);
    const Site site{"native allreduce", "the other ranks",
                    "ncclAllReduce of " + std::to_string(count) + " floats"};
    call(site, [&] {
      if (count == 0) return;
      void* dev = upload(m_send, data, bytes);
      enqueue(site, "ncclAllReduce", [&](ncclComm_t c) {
        return ncclAllReduce(dev, dev, count, ncclFloat, ncclSum, c, m_stream);
      });
      wait_done(site);
      download(site, data, dev, bytes);
    });
  }

  // Ranks as processes: the other processes learn of it through the launcher's runtime.
  void abort(const std::string& reason) override {
    std::string told;  // what this abort tells the other processes ("": an abort came first)
    {
      std::lock_guard<std::mutex> lock(m_w.abort_mu);
      if (!m_w.aborted.load(std::memory_order_relaxed)) {  // the first reason wins
        const std::string me = "rank " + std::to_string(m_rank);
        const bool named = reason.compare(0, me.size(), me) == 0 &&
                           (reason.size() == me.size() || reason[me.size()] == ' ' || reason[me.size()] == ':');
        m_w.abort_reason = named ? reason : me + " failed: " + reason;
        m_w.aborted.store(true, std::memory_order_release);
        told = m_w.abort_reason;
      }
    }
    if (m_w.group && !told.empty()) m_w.group->abort_world(told);
    abort_comm();
  }

  // This process's abort flag, or another process's abort (the launcher's runtime polled).
  bool aborted() const override {
    return m_w.aborted.load(std::memory_order_acquire) || (m_w.group && m_w.group->aborted());
  }

  // The first abort this process learnt of: its own, else another process's.
  std::string abort_reason() const override {
    {
      std::lock_guard<std::mutex> lock(m_w.abort_mu);
      if (m_w.aborted.load(std::memory_order_relaxed) || !m_w.group) return m_w.abort_reason;
    }
    return m_w.group->abort_reason();
  }

  // For the world: hands over / takes back the communicator (null once aborted).
  void set_comm(ncclComm_t c) {
    std::lock_guard<std::mutex> lock(m_comm_mu);
    m_comm = c;
  }
  ncclComm_t take_comm() {
    std::lock_guard<std::mutex> lock(m_comm_mu);
    return std::exchange(m_comm, nullptr);
  }

 private:
  enum class Progress { Pending, Done, Aborted };

  std::string me() const { return "rank " + std::to_string(m_rank); }

  void check_peer(int peer, const char* call) const {
    if (peer < 0 || peer >= m_w.n)
      throw CommError(me() + ": " + call + " with rank " + std::to_string(peer) + ", but the world has ranks 0.." +
                      std::to_string(m_w.n - 1));
  }

  // One NCCL group of ncclSend of sbuf to dst (dst >= 0) and ncclRecv into rbuf from src (src >=
  // 0): NCCL runs both at once, so a ring step where every rank sends and receives does not
  // deadlock. 0-byte halves are not posted.
  // on_device: sbuf and rbuf are device memory, used where they are; else host memory, staged.
  void p2p(const char* name, int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
           uint64_t tag, bool on_device = false) {
    const std::string to = "rank " + std::to_string(dst), from = "rank " + std::to_string(src);
    Site site{name, src < 0 || rbytes == 0 || src == dst ? to : dst < 0 || sbytes == 0 ? from : from + " or " + to, ""};
    if (dst >= 0) {
      site.what += " to " + to;
      site.detail = "ncclSend of " + std::to_string(sbytes) + " bytes";
    }
    if (src >= 0) {
      site.what += (dst >= 0 ? ", from " : " from ") + from;
      site.detail += (dst >= 0 ? " and " : "") + std::string("ncclRecv of ") + std::to_string(rbytes) + " bytes";
    }
    site.detail += (dst >= 0 && src >= 0 ? " in one group, tag " : ", tag ") + std::to_string(tag);
    call(site, [&] {
      if (sbytes == 0 && rbytes == 0) return;
      const void* sdev = sbytes == 0 ? nullptr : on_device ? sbuf : upload(m_send, sbuf, sbytes);
      void* rdev = rbytes == 0 ? nullptr : on_device ? rbuf : m_recv.reserve(rbytes);
      enqueue(site, "ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd", [&](ncclComm_t c) {
        const ncclResult_t start = ncclGroupStart();
        if (!nccl_ok(start)) return start;
        const ncclResult_t s = sbytes > 0 ? ncclSend(sdev, sbytes, ncclUint8, dst, c, m_stream) : ncclSuccess;
        const ncclResult_t r = rbytes > 0 ? ncclRecv(rdev, rbytes, ncclUint8, src, c, m_stream) : ncclSuccess;
        const ncclResult_t end = ncclGroupEnd();  // also after a failed send or recv: the group must close
        return !nccl_ok(s) ? s : !nccl_ok(r) ? r : end;
      });
      wait_done(site);
      if (rbytes > 0 && !on_device) download(site, rbuf, rdev, rbytes);
    });
  }

  // Runs one call's body on this rank's GPU. A CUDA or NCCL failure (DeviceError) leaves this
  // rank's communicator unusable: it aborts the world, so the other ranks stop too, unless
  // another rank failed first (then that is the cause, and the error says so).
  template <class Body>
  void call(const Site& site, Body&& body) {
    try {
      if (aborted()) give_up_aborted(site);
      set_device(m_device);
      body();
    } catch (const DeviceError& e) {
      if (aborted()) give_up_aborted(site);
      const std::string msg = me() + ": " + site.what + ": " + e.what();
      abort(msg);
      throw DeviceError(msg, e.hint());
    }
  }

  // host (bytes) -> the staging buffer `st`, on the stream. From pageable memory the copy is
  // staged by CUDA before cudaMemcpyAsync returns, so the caller's buffer is free again at once.
  void* upload(Staging& st, const void* host, size_t bytes) {
    void* dev = st.reserve(bytes);
    check_cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, m_stream), "cudaMemcpyAsync (upload)");
    return dev;
  }

  // The staging buffer -> host, once the NCCL operation has completed (never queued behind it:
  // a copy to pageable memory may block the host until the stream gets there).
  void download(const Site& site, void* host, const void* dev, size_t bytes) {
    check_cuda(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, m_stream), "cudaMemcpyAsync (download)");
    wait_done(site);
  }

  // Makes the NCCL call(s) of `op` on this rank's communicator under comm_mu. ncclInProgress is
  // fine (wait_done polls until the communicator leaves it); an error throws DeviceError.
  template <class Op>
  void enqueue(const Site& site, const char* what, Op&& op) {
    ncclResult_t r = ncclSuccess;
    bool gone = false;  // aborted meanwhile (from another thread): reported outside the lock
    {
      std::lock_guard<std::mutex> lock(m_comm_mu);
      if (m_comm != nullptr)
        r = op(m_comm);
      else
        gone = true;
    }
    if (gone) give_up_aborted(site);
    if (!nccl_ok(r)) throw_nccl(r, what);
  }

  // Done when NCCL has finished enqueueing (the communicator's state left ncclInProgress) and
  // the stream has run everything queued on it.
  Progress progress() {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(m_comm_mu);
      if (m_comm == nullptr) return Progress::Aborted;
      r = ncclCommGetAsyncError(m_comm, &state);
    }
    if (r != ncclSuccess) throw_nccl(r, "ncclCommGetAsyncError");
    if (state == ncclInProgress) return Progress::Pending;
    if (state != ncclSuccess) throw_nccl(state, "the communicator (ncclCommGetAsyncError)");
    const cudaError_t q = cudaStreamQuery(m_stream);
    if (q == cudaSuccess) return Progress::Done;
    if (q != cudaErrorNotReady) throw_cuda(q, "cudaStreamQuery");
    return Progress::Pending;
  }

  // Polls progress() until done; each round also looks at the world's abort flag and the
  // timeout (time while *m_hold is set does not count).
  void wait_done(const Site& site) {
    const double start = now_seconds();
    double last = start;
    double waited = 0;  // seconds that count towards the timeout
    for (;;) {
      const Progress p = progress();
      if (p == Progress::Done) return;
      if (p == Progress::Aborted || aborted()) give_up_aborted(site);
      const double now = now_seconds();
      if (!(m_hold && m_hold->load(std::memory_order_relaxed))) waited += now - last;
      last = now;
      if (waited > m_timeout) throw_timeout(site);
      if (now - start < kSpinSeconds) continue;
      if (now - start < kYieldSeconds)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(kSleep);
    }
  }

  // ncclCommAbort on this rank's communicator (stops its kernels; NCCL frees it), once.
  void abort_comm() {
    std::lock_guard<std::mutex> lock(m_comm_mu);
    if (m_comm == nullptr) return;
    ncclCommAbort(m_comm);  // nothing to do if it fails: the communicator is given up either way
    m_comm = nullptr;
  }

  // Another rank (or this one, from another thread) aborted: stop this rank's NCCL work too.
  [[noreturn]] void give_up_aborted(const Site& site) {
    abort_comm();
    throw CommError(me() + ": " + site.what + " aborted: " + abort_reason(),
                    "the first failing rank's error above is the cause; this rank stopped because of it");
  }

  // A timeout fails the whole world: this rank aborts with the timeout message, so the ranks
  // still waiting fail at once with the same cause instead of timing out one after another.
  [[noreturn]] void throw_timeout(const Site& site) {
    if (aborted()) give_up_aborted(site);  // another rank failed meanwhile: that is the cause
    const std::string msg = me() + ": timed out after " + seconds_text(m_timeout) + " s waiting for " + site.waits +
                            " (" + site.what + ": " + site.detail + ")";
    abort(msg);
    throw CommError(msg,
                    "a rank that never reaches a collective (it finished early, is stuck, or runs a different "
                    "collective) makes its peers time out; NCCL_DEBUG=INFO shows what each rank posted");
  }

  NcclWorldState& m_w;
  int m_rank;
  int m_device;
  cudaStream_t m_stream = nullptr;
  Staging m_send;  // uploads: send halves and the allreduce's buffer
  Staging m_recv;  // receive halves
  std::mutex m_comm_mu;
  ncclComm_t m_comm = nullptr;  // null before the world starts it and after an abort
};

namespace {

// "0, 1, 3"
std::string device_list(const std::vector<int>& devices) {
  std::string s;
  for (int d : devices) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

}  // namespace

// Teardown. Healthy: ncclCommFinalize of every communicator in one group (non-blocking: NCCL
// completes it in the background), poll until each has left ncclInProgress (at most timeout_s),
// then ncclCommDestroy. After an abort, an error or a finalize that does not complete: abort all.
NcclWorldState::~NcclWorldState() {
  KeepCurrentDevice keep;
  std::vector<ncclComm_t> comms;
  for (auto& t : transports)
    if (ncclComm_t c = t->take_comm()) comms.push_back(c);
  bool healthy = started && !aborted.load(std::memory_order_acquire) && !(group && group->aborted());
  for (ncclComm_t c : comms) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(c, &state) != ncclSuccess || state != ncclSuccess) healthy = false;
  }
  if (healthy && !comms.empty()) {
    healthy = nccl_ok(ncclGroupStart());
    for (ncclComm_t c : comms) healthy = nccl_ok(ncclCommFinalize(c)) && healthy;
    healthy = nccl_ok(ncclGroupEnd()) && healthy;
    const double deadline = now_seconds() + timeout_s;
    for (bool pending = healthy; pending;) {
      pending = false;
      for (ncclComm_t c : comms) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(c, &state) != ncclSuccess || !nccl_ok(state)) healthy = false;
        pending = pending || state == ncclInProgress;
      }
      if (!healthy || (pending && now_seconds() > deadline)) {
        healthy = false;
        break;
      }
      if (pending) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  for (ncclComm_t c : comms) {
    if (healthy)
      ncclCommDestroy(c);
    else
      ncclCommAbort(c);
  }
  transports.clear();  // streams and staging buffers, each on its GPU
}

namespace {

// Initializes the communicators of s's transports (ranks s.first_rank.., one per device of
// `devices`, of s.n) with `id`: one group of non-blocking inits, so that NCCL starts the ranks of
// this process concurrently, in its own threads; then polls each communicator until none is
// ncclInProgress (at most s.timeout_s; ranks as processes also stop when another process aborts).
// Throws DeviceError starting with `where`.
void start_communicators(NcclWorldState& s, const std::vector<int>& devices, const ncclUniqueId& id,
                         const std::string& where) {
  const int local = static_cast<int>(devices.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::vector<ncclComm_t> comms(static_cast<size_t>(local), nullptr);
  // Nothing may throw while the group is open: the first failure waits for its end.
  ncclResult_t failed = ncclGroupStart();
  if (!nccl_ok(failed)) throw_nccl(failed, "ncclGroupStart", where);
  int failed_k = -1;  // -1: ncclGroupEnd failed
  for (int k = 0; k < local && nccl_ok(failed); ++k) {
    // the rank's transport has just made this GPU current once: this cannot fail but for a lost driver
    failed = cudaSetDevice(devices[static_cast<size_t>(k)]) == cudaSuccess
                 ? ncclCommInitRankConfig(&comms[static_cast<size_t>(k)], s.n, id, s.first_rank + k, &config)
                 : ncclUnhandledCudaError;
    failed_k = k;
  }
  if (const ncclResult_t end = ncclGroupEnd(); nccl_ok(failed) && !nccl_ok(end)) {
    failed = end;
    failed_k = -1;
  }
  // Until `started`, the state's destructor aborts whatever was created, should this throw.
  for (int k = 0; k < local; ++k) s.transports[static_cast<size_t>(k)]->set_comm(comms[static_cast<size_t>(k)]);

  const double deadline = now_seconds() + s.timeout_s;
  for (bool pending = nccl_ok(failed); pending && nccl_ok(failed);) {
    pending = false;
    for (int k = 0; k < local && nccl_ok(failed); ++k) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comms[static_cast<size_t>(k)], &state);
      failed = q != ncclSuccess ? q : state;
      failed_k = k;
      pending = pending || state == ncclInProgress;
    }
    if (pending && s.group && s.group->aborted())
      throw CommError(where + "NCCL's initialization aborted: " + s.group->abort_reason(),
                      "the first failing rank's error above is the cause; this rank stopped because of it");
    if (pending && nccl_ok(failed) && now_seconds() > deadline)
      throw DeviceError(where + "NCCL's initialization did not finish within " + seconds_text(s.timeout_s) + " s",
                        "NCCL_DEBUG=INFO shows where it stops (a GPU that another process holds, peer-to-peer "
                        "access that hangs, or with ranks as processes a network NCCL cannot reach); raise "
                        "--timeout if the machine is merely slow");
    if (pending) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!nccl_ok(failed))
    throw_nccl(failed,
               failed_k < 0 ? std::string("ncclGroupEnd")
                            : "ncclCommInitRankConfig for rank " + std::to_string(s.first_rank + failed_k) + " on GPU " +
                                  std::to_string(devices[static_cast<size_t>(failed_k)]),
               where);
  s.started = true;
}

}  // namespace

NcclWorld::NcclWorld(const std::vector<int>& devices, double timeout_s) : m_state(new NcclWorldState) {
  NcclWorldState& s = *m_state;
  const int n = static_cast<int>(devices.size());
  if (n < 1) throw ConfigError("--comm nccl needs at least one rank (one GPU each), got none");
  s.n = n;
  s.timeout_s = timeout_s;
  const std::string where = "NCCL could not start " + std::to_string(n) + " rank" + (n == 1 ? "" : "s") +
                            " on GPU" + (n == 1 ? " " : "s ") + device_list(devices) + ": ";
  KeepCurrentDevice keep;
  try {
    for (int r = 0; r < n; ++r) s.transports.emplace_back(new TransportNccl(s, r, devices[r]));
  } catch (const DeviceError& e) {
    throw DeviceError(where + e.what(), e.hint());
  }
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) throw_nccl(r, "ncclGetUniqueId", where);
  start_communicators(s, devices, id, where);
}

NcclWorld::NcclWorld(ProcessGroup& group, int device, double timeout_s) : m_state(new NcclWorldState) {
  NcclWorldState& s = *m_state;
  s.n = group.size();
  s.first_rank = group.rank();
  s.timeout_s = timeout_s;
  s.group = &group;
  const std::string where = "rank " + std::to_string(s.first_rank) + ": NCCL could not start rank " +
                            std::to_string(s.first_rank) + " of " + std::to_string(s.n) + " on GPU " +
                            std::to_string(device) + ": ";
  // A rank that cannot start tells the others, so that none waits for it until the timeout.
  try {
    KeepCurrentDevice keep;
    try {
      s.transports.emplace_back(new TransportNccl(s, s.first_rank, device));
    } catch (const DeviceError& e) {
      throw DeviceError(where + e.what(), e.hint());
    }
    // Rank 0 makes the id; the launcher's runtime hands it to every process.
    ncclUniqueId id{};
    if (s.first_rank == 0)
      if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) throw_nccl(r, "ncclGetUniqueId", where);
    group.broadcast(&id, sizeof id, 0, timeout_s);
    start_communicators(s, {device}, id, where);
  } catch (const Error& e) {
    if (!group.aborted()) group.abort_world(e.what());
    throw;
  }
}

NcclWorld::~NcclWorld() = default;

int NcclWorld::world_size() const { return m_state->n; }

std::vector<int> NcclWorld::local_ranks() const {
  std::vector<int> r;
  for (size_t k = 0; k < m_state->transports.size(); ++k) r.push_back(m_state->first_rank + static_cast<int>(k));
  return r;
}

Transport& NcclWorld::transport(int rank) {
  const NcclWorldState& s = *m_state;
  if (rank < 0 || rank >= s.n)
    throw ConfigError("Invalid rank " + std::to_string(rank) + ", rank should be in the interval [0, " +
                      std::to_string(s.n - 1) + "]");
  const int k = rank - s.first_rank;
  if (k < 0 || k >= static_cast<int>(s.transports.size()))
    throw ConfigError("rank " + std::to_string(rank) + " runs in another process: this process is rank " +
                      std::to_string(s.first_rank) + " of the NCCL world");
  return *s.transports[static_cast<size_t>(k)];
}

}  // namespace lab
