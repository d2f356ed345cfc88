// Transport: point-to-point messaging between ranks. Collective algorithms (ring_allreduce.h,
// ...) are written once against this interface; backends/threads (emulated ranks in one
// process), backends/mpi and backends/nccl implement it.
//
// Protocol: messages between a pair of ranks are matched in order by (peer, tag). Every blocking
// call gives up after timeout() seconds of waiting (time while the run is paused, see
// set_hold_flag, does not count) and throws CommError naming this rank, the peer and the call.
// When any rank calls abort(), every blocking call on every other rank throws CommError whose
// message carries the aborting rank's reason.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lab {

class DeviceMemory;

// "%g" of a number of seconds, as the transports' timeout messages print it: "0.5", "60".
std::string seconds_text(double seconds);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const char* name() const = 0;  // "threads", "mpi", ...
  // A process group's (group_transport.h): the world rank of its rank r, and its name ("dp", ...).
  // A world's own transport: r, and "".
  virtual int world_rank(int r) const { return r; }
  virtual const char* group_name() const { return ""; }

  virtual void send(int dst, const void* buf, size_t bytes, uint64_t tag) = 0;
  virtual void recv(int src, void* buf, size_t bytes, uint64_t tag) = 0;
  // One ring step: send sbuf to dst and receive rbuf from src at the same time (no deadlock when
  // every rank does this at once). Returns when both are complete.
  virtual void sendrecv(int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                        uint64_t tag) = 0;
  // Like sendrecv, but the received float32 values are added into acc (acc[i] += in[i]), which a
  // transport may fuse with the copy. The default receives into scratch space and adds.
  virtual void sendrecv_reduce(int dst, const float* sbuf, size_t scount, int src, float* acc,
                               size_t rcount, uint64_t tag);
  // Receives one message with `tag` from whichever of srcs sends first and returns that rank
  // (a parameter server serving its workers in arrival order). The default throws ConfigError:
  // transports that cannot do it say so.
  virtual int recv_any(const std::vector<int>& srcs, void* buf, size_t bytes, uint64_t tag);
  // The transport's own allreduce (sum, float32, in place), e.g. MPI_Allreduce: a black-box peer
  // for comparison. The default throws ConfigError.
  virtual void native_allreduce_sum(float* data, size_t count);

  // ---- buffers on a device (device_memory.h) ----
  // Whether sendrecv_on and sendrecv_reduce_on move device memory directly between the ranks.
  // Those that do not (the default) have device buffers staged through host memory by the
  // Communicator.
  virtual bool device_aware() const { return false; }
  // sendrecv and sendrecv_reduce on buffers of `mem`'s device: its copies and adds in place of
  // memcpy and the CPU's. The defaults throw: only a device-aware transport is asked.
  virtual void sendrecv_on(DeviceMemory& mem, int dst, const void* sbuf, size_t sbytes, int src, void* rbuf,
                           size_t rbytes, uint64_t tag);
  virtual void sendrecv_reduce_on(DeviceMemory& mem, int dst, const float* sbuf, size_t scount, int src, float* acc,
                                  size_t rcount, uint64_t tag);
  // Whether native_allreduce_sum_on runs the transport's own allreduce on device memory (NCCL).
  virtual bool native_on_device() const { return false; }
  virtual void native_allreduce_sum_on(DeviceMemory& mem, float* data, size_t count);

  // Tells every other rank that this rank failed with `reason` (their calls then throw).
  virtual void abort(const std::string& reason) = 0;
  // True once any rank has aborted; reason of the first abort.
  virtual bool aborted() const = 0;
  virtual std::string abort_reason() const = 0;

  void set_timeout(double seconds) { m_timeout = seconds; }
  double timeout() const { return m_timeout; }
  // While *hold is true (the run is paused), waiting does not count towards the timeout.
  void set_hold_flag(const std::atomic<bool>* hold) { m_hold = hold; }

 protected:
  double m_timeout = 60.0;
  const std::atomic<bool>* m_hold = nullptr;
  std::vector<float> m_scratch;  // used by the default sendrecv_reduce
};

// The ranks of one run as seen from the process that drives them: emulated ranks (all of them
// in this process) or, later, one real process's rank. Implemented by backends.
class World {
 public:
  virtual ~World() = default;
  virtual int world_size() const = 0;
  // Ranks driven by this process (all of them for emulated ranks).
  virtual std::vector<int> local_ranks() const = 0;
  virtual Transport& transport(int rank) = 0;
};

}  // namespace lab
