// Communicator: the collectives a training rank uses, written over a Transport. It numbers
// every collective (op_seq, identical on all ranks), records each chunk transfer and each whole
// collective as Events, wraps transport errors with the operation and the training step, and
// lets a StepGate pause the world between ring steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "device_memory.h"
#include "events.h"
#include "transport.h"

namespace lab {

// Broadcast pipelining unit: the chain from root forwards a segment as soon as it has arrived.
constexpr size_t kBroadcastSegmentBytes = size_t{1} << 20;

// Called by each rank before each step of a collective (one ring step = every rank sends one
// chunk). The run uses it to pause and single-step; nullptr: free-running.
class StepGate {
 public:
  virtual ~StepGate() = default;
  virtual void before_step(int rank, const Event& next) = 0;
};

// The algorithm behind Communicator::allreduce_sum. Each gives every rank bitwise identical
// results; the bits depend on the algorithm (its summation order) and the world size.
enum class AllreduceAlgorithm {
  Ring,    // ring_allreduce.h: reduce-scatter then allgather round a ring (the default)
  Naive,   // naive_allreduce.h: gather to rank 0, sum in rank order, send back (parameter server)
  Tree,    // tree_allreduce.h: recursive halving-doubling
  Native,  // the transport's own, Transport::native_allreduce_sum (MPI_Allreduce, ncclAllReduce): a black box
};

// "ring", "naive", "tree", "mpi" (Native; parse_allreduce_algorithm also takes "nccl" for it).
const char* allreduce_algorithm_name(AllreduceAlgorithm a);
// The inverse of allreduce_algorithm_name; throws ConfigError naming the choices.
AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name);

// Identifies a collective in events and error messages.
struct CollectiveInfo {
  const char* what = "";  // "grad bucket", "bn stats", ...
  int tag = -1;           // bucket index or module index
};

class Communicator {
 public:
  Communicator(Transport& transport, EventLog* log, StepGate* gate = nullptr);
  // A communicator over a process group of this rank (group_transport.h), recording into the same
  // log through the same gate, with this one's algorithm. Its collectives are numbered on their own.
  std::unique_ptr<Communicator> sub(Transport& group) const;
  int rank() const;
  int world_size() const;
  Transport& transport() { return m_t; }

  // The training step recorded in events and named in errors.
  void set_train_step(int64_t step) { m_train_step = step; }
  int64_t train_step() const { return m_train_step; }

  // In-place sum over ranks with the algorithm set below (ring unless changed). Every rank ends
  // with bitwise identical values. Native records only its Collective event (no steps visible).
  // mem: data lives on that device (device_memory.h). The ring on a device-aware transport works
  // there, chunk by chunk, and so does a transport's own allreduce that can (NCCL's); anything else
  // (the tree, the naive gather, a transport that is not device-aware, such as MPI) has the buffer
  // staged: downloaded, reduced in host memory, uploaded. The bits are the host's either way.
  void allreduce_sum(float* data, size_t count, CollectiveInfo info, DeviceMemory* mem = nullptr);
  // Whether allreduce_sum on `mem`'s buffers stays on the device (no staging).
  bool allreduce_on_device() const {
    return (m_algorithm == AllreduceAlgorithm::Ring && m_t.device_aware()) ||
           (m_algorithm == AllreduceAlgorithm::Native && m_t.native_on_device());
  }
  // Every rank of a world must use the same algorithm.
  void set_allreduce_algorithm(AllreduceAlgorithm a) { m_algorithm = a; }
  // --nondeterministic: algorithms that add several ranks' buffers on one rank (naive) add them
  // in arrival order, not rank order; the bits then depend on timing.
  void set_arrival_order(bool on) { m_arrival_order = on; }
  bool arrival_order() const { return m_arrival_order; }
  AllreduceAlgorithm allreduce_algorithm() const { return m_algorithm; }
  // Root's bytes overwrite every other rank's (a ring pipeline is not needed: a chain from root).
  void broadcast(void* data, size_t bytes, int root, CollectiveInfo info);
  // all = concat of every rank's `count` floats in rank order; all has world_size*count floats.
  // mem: mine and all live on that device; the ring runs there on a device-aware transport, and
  // is staged through the host otherwise (as allreduce_sum's).
  void allgather(const float* mine, size_t count, float* all, CollectiveInfo info, DeviceMemory* mem = nullptr);

  // The halves of an allreduce as collectives of their own (sharded_collectives.h), in place on N
  // blocks of `count` floats, block b at data + b count, with the algorithm set above: ring
  // (default), naive, or tree where the world size is a power of two; the transport's own and a
  // tree over another world size are refused (ConfigError). mem: as allreduce_sum's (the ring
  // works on the device on a device-aware transport; anything else is staged through the host).
  // reduce_scatter_sum: afterwards block r holds the sum over ranks of everyone's block r (the
  // other blocks: partial sums).
  void reduce_scatter_sum(float* data, size_t count, CollectiveInfo info, DeviceMemory* mem = nullptr);
  // allgather_in_place: block r is this rank's input; afterwards every rank holds every block.
  // (allgather above, which SyncBatchNorm uses, is always the plain ring.)
  void allgather_in_place(float* data, size_t count, CollectiveInfo info, DeviceMemory* mem = nullptr);

  // Bytes this rank has sent so far.
  uint64_t bytes_sent() const { return m_bytes_sent; }
  // From a checkpoint: the bytes sent and collectives started before it (the event sequence).
  void restore_counters(uint64_t bytes_sent, uint64_t seq) {
    m_bytes_sent = bytes_sent;
    m_seq = seq;
  }
  uint64_t seq() const { return m_seq; }

  // Events of collective `seq` with this rank's identity filled in: the whole call (t_start set
  // to now) and the template of its chunk transfers (sender = this rank).
  Event collective_event(const char* op, uint64_t seq, CollectiveInfo info, uint64_t bytes) const;
  Event chunk_event(const char* op, uint64_t seq, CollectiveInfo info) const;

  // Runs f() and records it as this rank's compute event `op` in `phase` of training step `step`
  // (-1: outside training); returns what f returns. An exception from f records nothing. tag: the
  // event's (a pipeline's micro-batch; -1 none).
  template <class F>
  decltype(auto) timed(Phase phase, const char* op, int64_t step, F&& f, int tag = -1) {
    Event e;
    e.kind = EventKind::Compute;
    e.tag = tag;
    e.rank = rank();
    e.train_step = step;
    e.phase = phase;
    e.op = op;
    e.t_start = now_seconds();
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      f();
      e.t_end = now_seconds();
      record(e);
      record_device_events(step);
    } else {
      decltype(auto) result = f();
      e.t_end = now_seconds();
      record(e);
      record_device_events(step);
      return result;
    }
  }
  // Where a device's own timeline comes from (ModelExecutor::take_device_events): after every
  // timed phase, what the device did is recorded as this rank's Device events of that step.
  void set_device_events(std::function<void(std::vector<Event>&)> source) { m_device_events = std::move(source); }

  // Used by algorithms: record one chunk event / call the gate.
  uint64_t next_seq() { return m_seq++; }
  // (over a process group: the event's ranks translated to the world's, and its group named)
  void record(const Event& e);
  void gate(const Event& next);
  Event in_world(const Event& e) const;
  void add_bytes_sent(uint64_t b) { m_bytes_sent += b; }

 private:
  Transport& m_t;
  EventLog* m_log;
  StepGate* m_gate;
  int64_t m_train_step = -1;
  uint64_t m_seq = 0;
  uint64_t m_bytes_sent = 0;
  AllreduceAlgorithm m_algorithm = AllreduceAlgorithm::Ring;
  bool m_arrival_order = false;
  std::function<void(std::vector<Event>&)> m_device_events;
  std::vector<float> m_staged;  // a device buffer's host copy, for a collective that cannot work there
  std::vector<Event> m_device_buf;
  void record_device_events(int64_t step);
  void blocks_collective(const char* op, float* data, size_t count, CollectiveInfo info, DeviceMemory* mem);
};

}  // namespace lab
