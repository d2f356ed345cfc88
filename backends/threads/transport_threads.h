// Emulated ranks: a Transport over threads of one process. Supports everything in
// lab/transport.h, with zero-copy sendrecv/sendrecv_reduce (the receiver reads the sender's
// buffer directly) and spin-then-yield waiting; timeouts and abort as the interface requires.
#pragma once

#include <memory>

#include "transport.h"

namespace lab {

struct ThreadsWorldState;

// The shared state of N emulated ranks. Create one per run, then one transport per rank thread.
class ThreadsWorld : public World {
 public:
  explicit ThreadsWorld(int world_size);
  ~ThreadsWorld() override;
  int world_size() const override;
  std::vector<int> local_ranks() const override;  // all of them
  // The transport of `rank`, owned by the world; used only by that rank's thread.
  Transport& transport(int rank) override;

 private:
  std::unique_ptr<ThreadsWorldState> m_state;
};

}  // namespace lab
