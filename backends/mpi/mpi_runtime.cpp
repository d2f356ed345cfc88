// MpiRuntime: MPI_Init_thread .. MPI_Finalize and the control channel; see mpi_runtime.h for what
// is supported. The abort text travels as a plain MPI message so that every rank can print the
// real cause before the job ends; MPI_Abort is the last resort, only when a peer does not reach
// the shutdown barrier within the grace period.
#include "mpi_runtime.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "errors.h"
#include "events.h"

namespace lab {

namespace {

constexpr int kTagAbort = 1;
constexpr int kTagQuery = 2;
constexpr int kTagAnswer = 3;
// On success, peers wait at the shutdown barrier while rank 0 evaluates the final model and
// writes the run directory: that is not bounded by --timeout, so give it this long at least.
constexpr double kSuccessShutdownSeconds = 600;
// A failing process waits at least this long for its peers to print their errors and arrive.
constexpr double kMinFailureGraceSeconds = 2;
// Abort texts sent to peers are cut to this, so that they travel eagerly (Open MPI's shared
// memory eager limit is 4 KiB) and MPI_Mrecv of a probed abort returns at once.
constexpr size_t kMaxAbortTextBytes = 3000;

MpiRuntime* g_current = nullptr;  // MPI is per process; so is its runtime


std::optional<long> env_long(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0')
    throw ConfigError(std::string("environment variable ") + name + "='" + v + "' is not a number",
                      "it should hold this process's rank or the number of processes");
  return x;
}

}  // namespace

MpiRuntime* MpiRuntime::current() { return g_current; }

MpiRuntime::MpiRuntime(double timeout_s, std::string comm) : m_timeout(timeout_s), m_comm("--comm " + comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized || g_current)
    throw ConfigError(m_comm + ": MPI is already initialized in this process",
                      "only the dtlab executable's main() starts MPI, once");
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
    throw CommError(m_comm + ": MPI_Init_thread failed", "run dtlab under mpirun, e.g. mpirun -np 4 dtlab run " + m_comm + " ...");
  g_current = this;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &m_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &m_size);
  if (provided < MPI_THREAD_SERIALIZED)
    throw ConfigError("rank " + std::to_string(m_rank) + ": this MPI library gives thread level " +
                          std::to_string(provided) + "; dtlab needs MPI_THREAD_SERIALIZED or better",
                      "use Open MPI 4 (apt-get install openmpi-bin libopenmpi-dev)");
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  if (flag && ub) m_tag_ub = *ub;
  // Communicators: nonblocking duplicates so that even setup has a deadline. Every process
  // reaches this right after MPI_Init, in the same order.
  MPI_Comm* comms[3] = {&m_data, &m_ctrl, &m_coll};
  for (MPI_Comm* c : comms) {
    MPI_Request req;
    check(MPI_Comm_idup(MPI_COMM_WORLD, c, &req), "MPI_Comm_idup");
    const double start = now_seconds();
    for (int done = 0; !done;) {
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test (MPI_Comm_idup)");
      if (done) break;
      if (now_seconds() - start > m_timeout)
        throw CommError("rank " + std::to_string(m_rank) + ": setting up MPI communicators took longer than " +
                            seconds_text(m_timeout) + " s: not every process of the job got there",
                        "every process must run `dtlab run " + m_comm + "` with the same flags");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

MpiRuntime::~MpiRuntime() {
  // main() always calls shutdown() first. Had it not, MPI is left to the launcher, which reports
  // a process that ended without MPI_Finalize and stops the job.
  if (g_current == this) g_current = nullptr;
}

void MpiRuntime::check(int rc, const char* what) const {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError("rank " + std::to_string(m_rank) + ": " + what + ": " + std::string(text, static_cast<size_t>(len)));
}

// Rank and size from the launcher's environment, checked against MPI's own.
void MpiRuntime::resolve_world(RunConfig& cfg, bool world_size_given) {
  struct Source {
    const char* rank_var;
    const char* size_var;
    const char* what;
  };
  const Source sources[] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI (OMPI_COMM_WORLD_RANK/SIZE)"},
                            {"RANK", "WORLD_SIZE", "torchrun-style RANK/WORLD_SIZE"}};
  std::string used;
  for (const Source& s : sources) {
    const auto r = env_long(s.rank_var);
    const auto n = env_long(s.size_var);
    if (!r && !n) continue;
    if (!r || !n)
      throw ConfigError(std::string(r ? s.rank_var : s.size_var) + " is set but " + (r ? s.size_var : s.rank_var) +
                            " is not",
                        "set both (or neither); under mpirun Open MPI sets OMPI_COMM_WORLD_RANK/SIZE itself");
    if (*r != m_rank || *n != m_size)
      throw ConfigError("MPI says this process is rank " + std::to_string(m_rank) + " of " + std::to_string(m_size) +
                            ", but " + s.rank_var + "=" + std::to_string(*r) + " " + s.size_var + "=" +
                            std::to_string(*n),
                        "the launcher's environment and MPI disagree: start every process with one mpirun "
                        "(mpirun -np N dtlab run " + m_comm + " ...) and do not set " +
                            std::string(s.rank_var) + "/" + s.size_var + " by hand");
    if (used.empty()) used = s.what;
  }
  if (used.empty()) used = "MPI_Comm_rank/size (no launcher environment)";
  m_describe = "ranks: " + std::to_string(m_size) + (m_size == 1 ? " process" : " processes") + " via " + used +
               "; this process is rank " + std::to_string(m_rank);
  if (world_size_given && cfg.world_size != m_size)
    throw ConfigError("--world-size " + std::to_string(cfg.world_size) + " does not match the MPI world: mpirun started " +
                          std::to_string(m_size) + (m_size == 1 ? " process" : " processes"),
                      "with " + m_comm + " under mpirun every rank is a process: leave out --world-size (it is taken "
                      "from MPI) or start mpirun -np " + std::to_string(cfg.world_size));
  cfg.world_size = m_size;
  if (cfg.comm == "nccl") {
    cfg.compute.rank_nodes = gather_nodes();
    int machines = 0;
    for (int r = 0; r < m_size; ++r) machines += cfg.compute.rank_nodes[static_cast<size_t>(r)] == r;
    m_describe += " (" + std::to_string(machines) + (machines == 1 ? " machine" : " machines") +
                  "); NCCL carries the collectives, MPI started the processes and hands NCCL its unique id";
  }
}

// Every process's processor name (MPI_Get_processor_name: the host name under Open MPI),
// gathered; a rank's machine is the lowest rank with the same name.
std::vector<int> MpiRuntime::gather_nodes() {
  std::vector<char> mine(MPI_MAX_PROCESSOR_NAME + 1, '\0'), all(static_cast<size_t>(m_size) * mine.size());
  int len = 0;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    check(MPI_Get_processor_name(mine.data(), &len), "MPI_Get_processor_name");
  }
  MPI_Request req = MPI_REQUEST_NULL;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    check(MPI_Iallgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(), static_cast<int>(mine.size()),
                         MPI_CHAR, m_coll, &req),
          "MPI_Iallgather (processor names)");
  }
  wait_collective(req, m_timeout, "gathering the processes' machine names (MPI_Iallgather)");
  std::vector<std::string> names(static_cast<size_t>(m_size));
  for (int r = 0; r < m_size; ++r) names[static_cast<size_t>(r)] = std::string(all.data() + static_cast<size_t>(r) * mine.size());
  std::vector<int> nodes(static_cast<size_t>(m_size));
  for (int r = 0; r < m_size; ++r)
    nodes[static_cast<size_t>(r)] = static_cast<int>(
        std::find(names.begin(), names.end(), names[static_cast<size_t>(r)]) - names.begin());
  return nodes;
}

void MpiRuntime::broadcast(void* data, size_t bytes, int root, double timeout_s) {
  if (bytes > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw CommError("rank " + std::to_string(m_rank) + ": broadcast of " + std::to_string(bytes) + " bytes: too large for one MPI call");
  MPI_Request req = MPI_REQUEST_NULL;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, m_coll, &req), "MPI_Ibcast");
  }
  wait_collective(req, timeout_s, "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root) + " (MPI_Ibcast)");
}

void MpiRuntime::wait_collective(MPI_Request& req, double timeout_s, const std::string& what) {
  const std::string me = "rank " + std::to_string(m_rank);
  const double start = now_seconds();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(m_mu);
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      service_locked();
    }
    if (m_aborted.load(std::memory_order_acquire)) {
      poison(what + " left pending by an abort");  // MPI may still write into its buffer
      throw CommError(me + ": " + what + " aborted: " + abort_reason(),
                      "the first failing rank's error above is the cause; this rank stopped because of it");
    }
    if (now_seconds() - start > timeout_s) {
      poison(what + " timed out");
      const std::string msg = me + ": timed out after " + seconds_text(timeout_s) + " s: " + what +
                              ": not every process of the job got there";
      abort_world(msg);
      throw CommError(msg, "every process must run `dtlab run " + m_comm + "` with the same flags");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::string MpiRuntime::named(const std::string& reason) const {
  const std::string me = "rank " + std::to_string(m_rank);
  const bool is_named = reason.compare(0, me.size(), me) == 0 &&
                        (reason.size() == me.size() || reason[me.size()] == ' ' || reason[me.size()] == ':');
  return is_named ? reason : me + " failed: " + reason;
}

void MpiRuntime::send_control_locked(int dst, int tag, std::vector<char> payload) {
  m_ctrl_sends.push_back({MPI_REQUEST_NULL, std::move(payload)});
  PendingSend& p = m_ctrl_sends.back();
  // The vector's heap buffer does not move when the PendingSend is moved later.
  MPI_Isend(p.buf.data(), static_cast<int>(p.buf.size()), MPI_CHAR, dst, tag, m_ctrl, &p.req);
}

bool MpiRuntime::abort_world(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(m_abort_mu);
    if (m_aborted.load(std::memory_order_relaxed)) return false;  // the first reason wins
    m_reason = named(reason);
    m_aborted.store(true, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lock(m_mu);
  if (m_finalized) return true;
  std::string text = abort_reason();
  if (text.size() > kMaxAbortTextBytes) text = text.substr(0, kMaxAbortTextBytes - 3) + "...";
  for (int r = 0; r < m_size; ++r)
    if (r != m_rank) send_control_locked(r, kTagAbort, std::vector<char>(text.begin(), text.end()));
  return true;
}

std::string MpiRuntime::abort_reason() const {
  std::lock_guard<std::mutex> lock(m_abort_mu);
  return m_reason;
}

bool MpiRuntime::aborted() {
  service_control();
  return m_aborted.load(std::memory_order_acquire);
}

void MpiRuntime::service_control() {
  std::lock_guard<std::mutex> lock(m_mu);
  if (!m_finalized) service_locked();
}

// One round: every control message that has arrived, then the bookkeeping of our own sends.
// Messages are taken with MPI_Improbe + MPI_Mrecv: the probed message is ours alone, and it is
// short (eager), so MPI_Mrecv returns at once.
void MpiRuntime::service_locked() {
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, m_ctrl, &flag, &msg, &st) != MPI_SUCCESS || !flag) break;
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    std::vector<char> buf(static_cast<size_t>(std::max(count, 1)));
    MPI_Mrecv(buf.data(), count, MPI_CHAR, &msg, MPI_STATUS_IGNORE);
    const int src = st.MPI_SOURCE;
    if (st.MPI_TAG == kTagAbort) {
      std::lock_guard<std::mutex> alock(m_abort_mu);
      if (!m_aborted.load(std::memory_order_relaxed)) {
        m_reason.assign(buf.data(), static_cast<size_t>(count));
        m_aborted.store(true, std::memory_order_release);
      }
    } else if (st.MPI_TAG == kTagQuery && count == static_cast<int>(sizeof(int32_t))) {
      int32_t answer[2];
      std::memcpy(&answer[0], buf.data(), sizeof(int32_t));
      answer[1] = m_waiting_for.load(std::memory_order_relaxed);
      std::vector<char> payload(sizeof answer);
      std::memcpy(payload.data(), answer, sizeof answer);
      send_control_locked(src, kTagAnswer, std::move(payload));
    } else if (st.MPI_TAG == kTagAnswer && count == static_cast<int>(2 * sizeof(int32_t))) {
      int32_t answer[2];
      std::memcpy(answer, buf.data(), sizeof answer);
      if (answer[0] == m_query_id && src == m_query_peer) m_answer = answer[1];  // else: a late answer
    }
  }
  auto done = [](PendingSend& p) {
    int flag = 1;
    if (p.req != MPI_REQUEST_NULL) MPI_Test(&p.req, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  };
  m_ctrl_sends.erase(std::remove_if(m_ctrl_sends.begin(), m_ctrl_sends.end(), done), m_ctrl_sends.end());
  m_orphans.erase(std::remove_if(m_orphans.begin(), m_orphans.end(), done), m_orphans.end());
}

std::optional<int> MpiRuntime::query_waiting_for(int peer, double seconds) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    if (m_finalized) return std::nullopt;
    ++m_query_id;
    m_query_peer = peer;
    m_answer.reset();
    std::vector<char> payload(sizeof(int32_t));
    std::memcpy(payload.data(), &m_query_id, sizeof(int32_t));
    send_control_locked(peer, kTagQuery, std::move(payload));
  }
  const double start = now_seconds();
  for (;;) {
    service_control();
    {
      std::lock_guard<std::mutex> lock(m_mu);
      if (m_answer) return m_answer;
    }
    if (m_aborted.load(std::memory_order_acquire) || now_seconds() - start > seconds) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void MpiRuntime::orphan(MPI_Request req, std::vector<char> buffer) {
  std::lock_guard<std::mutex> lock(m_mu);
  m_orphans.push_back({req, std::move(buffer)});
}

void MpiRuntime::poison(const std::string& why) {
  std::lock_guard<std::mutex> lock(m_mu);
  if (m_poisoned.empty()) m_poisoned = why;
}

bool MpiRuntime::wait_control(MPI_Request& req, double seconds) {
  const double start = now_seconds();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(m_mu);
      int done = 0;
      if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) return true;
      service_locked();
    }
    if (now_seconds() - start > seconds) return false;
    // Sleep, not spin: on success rank 0 is still computing on these cores.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

CommRuntime::ShutdownResult MpiRuntime::shutdown(int exit_code, const std::string& error) {
  if (m_finalized) return {};
  set_waiting_for(kFinished);
  // A process that fails outside any collective (bad flag, missing data, unwritable run
  // directory) tells the others here, so they stop at once instead of timing out.
  if (exit_code != 0) abort_world(error.empty() ? "exit code " + std::to_string(exit_code) : error);
  const double grace = exit_code == 0 ? std::max(m_timeout, kSuccessShutdownSeconds)
                                      : std::max(m_timeout, kMinFailureGraceSeconds);
  MPI_Request barrier = MPI_REQUEST_NULL;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    MPI_Ibarrier(m_ctrl, &barrier);
  }
  if (!wait_control(barrier, grace))
    return {false, "rank " + std::to_string(m_rank) + ": not every process reached the end of the run within " +
                       seconds_text(grace) + " s; stopping the job (MPI_Abort)"};
  service_control();  // what arrived before the barrier completed
  std::lock_guard<std::mutex> lock(m_mu);
  if (!m_poisoned.empty())
    return {false, "rank " + std::to_string(m_rank) + ": " + m_poisoned + "; stopping the job (MPI_Abort)"};
  MPI_Finalize();
  m_finalized = true;
  // Only now may the buffers of unfinished sends go: MPI no longer touches them.
  m_ctrl_sends.clear();
  m_orphans.clear();
  return {};
}

void MpiRuntime::kill_job(int exit_code) { MPI_Abort(MPI_COMM_WORLD, exit_code != 0 ? exit_code : 1); }

}  // namespace lab
