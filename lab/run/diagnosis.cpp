// Diagnosis: what the run says when it fails. The first error that is not a communication error
// is the root cause (the others follow from it: every rank aborts its transport when it fails, so
// its peers' blocking calls fail at once); finish() then reports the root cause first, and where
// every other rank was. --uneven-data without --join gets its own account: who ran out of data,
// who waited in which collective.
#include <sstream>

#include "run.h"
#include "run_internal.h"

namespace lab {

void Run::fail_rank(int rank, const std::exception& e, bool is_comm) {
  std::string msg = e.what();
  std::string hint;
  if (const auto* le = dynamic_cast<const Error*>(&e)) hint = le->hint();
  std::string full = is_comm ? msg : "rank " + std::to_string(rank) + " failed: " + msg;
  {
    std::lock_guard<std::mutex> lock(m_err_mu);
    m_errors[static_cast<size_t>(rank)] = full;
    const bool take = m_root_code == 0 || (!is_comm && m_root_code == kExitCommunication);
    if (take) {
      m_root_rank = rank;
      const auto* le = dynamic_cast<const Error*>(&e);
      m_root_code = le ? le->exit_code() : kExitFailure;
      m_root_what = full;
      m_root_hint = hint;
    }
  }
  // Tell every other rank: their blocking calls now fail at once instead of timing out.
  m_world->transport(rank).abort(full);
}

// --uneven-data without --join. Ranks that ran out of data wait (the mode's after_batches) while the others block
// in their next collective until the timeout; that timeout is the root error. Rewritten here into
// what happened: who waited in which collective, who had finished after how many steps.
void Run::throw_if_ranks_ran_out(const std::string& root_what) {
  if (root_what.find("timed out") == std::string::npos) return;  // a real failure: report it as is
  std::vector<int> finished, waiting;
  for (size_t r = 0; r < m_ranks.size(); ++r) {
    std::lock_guard<std::mutex> lock(m_ranks[r]->mu);
    (m_ranks[r]->out_of_data_step >= 0 ? finished : waiting).push_back(static_cast<int>(r));
  }
  if (finished.empty()) return;
  auto list = [](const std::vector<int>& v) {
    std::string s = v.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
  };
  // A collective's error reads "rank R: allreduce #41 (grad bucket 1) at step 4: <detail>"
  // (communicator.cpp's error protocol): the collective is the part before the detail.
  auto collective_of = [](const std::string& err, int r) {
    const std::string prefix = "rank " + std::to_string(r) + ": ";
    if (err.compare(0, prefix.size(), prefix) != 0) return err.empty() ? std::string("(stopped)") : err;
    const std::string rest = err.substr(prefix.size());
    return rest.substr(0, rest.find(": "));
  };
  std::ostringstream msg;
  msg << "uneven inputs without --join: " << list(finished) << " ran out of data while " << list(waiting)
      << " still had batches; those waited in their next collective for ranks that had left training until the "
      << m_cfg.timeout_s << " s timeout";
  std::lock_guard<std::mutex> lock(m_err_mu);
  for (size_t r = 0; r < m_ranks.size(); ++r) {
    const RankState& rs = *m_ranks[r];
    if (rs.out_of_data_step >= 0)
      msg << "\n  rank " << r << ": finished: ran out of data after " << rs.out_of_data_step << " steps (its "
          << rs.out_of_data_batches << " batches of epoch " << rs.out_of_data_epoch << ") and never joined that collective";
    else
      msg << "\n  rank " << r << ": waiting in " << collective_of(m_errors[r], static_cast<int>(r))
          << " (it still had batches)";
  }
  throw CommError(msg.str(),
                  "DDP needs every rank in every collective. Pass --join (DDP's join context: ranks that run out "
                  "of data shadow the others' collectives with zero gradients and the run completes), or give "
                  "every rank the same number of batches (drop --uneven-data)");
}

// The root cause first, then how every other rank of this process ended: thrown with the root
// cause's exit code and hint. A rank of a multi-process world that stopped without an error of its
// own (it hung, or was past its last collective) when another process's rank failed: the world's
// abort is its error.
void Run::throw_if_failed() {
  if (m_root_code == kExitCommunication) throw_if_ranks_ran_out(m_root_what);
  if (m_root_code) {
    std::ostringstream msg;
    msg << m_root_what;
    for (size_t r = 0; r < m_errors.size(); ++r) {
      if (static_cast<int>(r) == m_root_rank || !is_local(static_cast<int>(r))) continue;
      // The others' errors end with the root cause's text: keep where each rank was.
      std::string e = m_errors[r];
      const size_t cut = e.find(" aborted: ");
      if (cut != std::string::npos) e = e.substr(0, cut) + " aborted";
      const std::string self = "rank " + std::to_string(r) + ": ", self_failed = "rank " + std::to_string(r) + " failed: ";
      if (e.rfind(self, 0) == 0) e = e.substr(self.size());
      else if (e.rfind(self_failed, 0) == 0) e = "failed: " + e.substr(self_failed.size());
      msg << "\n  rank " << r << ": " << (e.empty() ? "stopped" : e);
    }
    throw_error(m_root_code, msg.str(), m_root_hint);
  }
  if (m_local.size() < static_cast<size_t>(m_cfg.world_size))
    for (int r : m_local)
      if (m_world->transport(r).aborted())
        throw CommError("rank " + std::to_string(r) + ": stopped because another rank failed: " +
                            m_world->transport(r).abort_reason(),
                        "the first failing rank's error is the cause; this rank stopped because of it");
}

}  // namespace lab
