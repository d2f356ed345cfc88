#include "run_progress.h"

#include <cmath>
#include <cstdio>

#include "checkpoint.h"
#include "errors.h"
#include "mode.h"

namespace commands {

std::string ProgressLine::line(const lab::Snapshot& s, double now, int waiting_for, double timeout_s) {
  if (s.latest.empty()) return "";
  const lab::StepRecord& r = s.latest[0];
  const int64_t done = r.batch_size ? r.step + 1 : 0;
  if (done != m_done) {
    m_done = done;
    m_since = now;
  }
  constexpr int kWidth = 30;
  const int fill = s.steps_total ? static_cast<int>(kWidth * done / s.steps_total) : 0;
  std::string bar(static_cast<size_t>(fill), '#');
  bar.resize(kWidth, '.');
  const long long epochs = s.steps_per_epoch ? (s.steps_total + s.steps_per_epoch - 1) / s.steps_per_epoch : 1;
  char head[160];
  std::snprintf(head, sizeof head, "[%s] epoch %lld/%lld step %lld/%lld", bar.c_str(), static_cast<long long>(r.epoch + 1),
                epochs, static_cast<long long>(done), static_cast<long long>(s.steps_total));
  char tail[200];
  const double stalled = now - m_since;
  if (stalled >= kStallSeconds && done < s.steps_total) {
    const std::string whom = waiting_for >= 0 ? " (waiting for rank " + std::to_string(waiting_for) + ")" : "";
    std::snprintf(tail, sizeof tail, "  no iteration finished for %.0f s: iteration %lld is still running%s; a "
                  "collective fails after --timeout %g s", stalled, static_cast<long long>(done), whom.c_str(), timeout_s);
  } else {
    // the loss of a rank that computes one (a pipeline's last stage; rank 0 elsewhere)
    const lab::StepRecord* shown = &r;
    for (const lab::StepRecord& x : s.latest)
      if (std::isnan(shown->loss) && !std::isnan(x.loss)) shown = &x;
    std::snprintf(tail, sizeof tail, "  loss %.4f  acc %.3f  %.0f samples/s", shown->loss,
                  shown->batch_size ? static_cast<double>(shown->correct) / static_cast<double>(shown->batch_size) : 0.0,
                  s.samples_per_s);
  }
  return std::string(head) + tail;
}

// What the run directory keeps after a run that stopped early: the newest intact checkpoint and
// the command that continues it, or why there is none.
std::string what_the_run_directory_keeps(const lab::RunConfig& c, bool ranks_are_processes) {
  if (c.out_dir.empty()) return "no run directory to keep it in (--out DIR; with it, Ctrl-C writes a checkpoint)";
  try {
    const lab::FoundCheckpoint f = lab::find_checkpoint(c.out_dir);
    const std::string again = ranks_are_processes
                                  ? "mpirun -np " + std::to_string(c.world_size) + " dtlab run --comm " + c.comm
                                  : "dtlab run";
    return "the run directory keeps its checkpoint at iteration " + std::to_string(f.step) +
           " (intact); continue with:\n  " + again + " --resume " + c.out_dir;
  } catch (const lab::Error&) {
  }
  if (!lab::checkpointable(c))
    return "the run directory holds what was finished (no checkpoint: checkpoints cover --mode " +
           lab::modes_with(&lab::ModeCaps::checkpoints) + " without --uneven-data or --join)";
  if (c.checkpoint_every == 0 && !c.checkpoint_every_epoch)
    return "the run directory holds what was finished; it has no checkpoint to continue from (--checkpoint-every N "
           "or --checkpoint-every-epoch write them)";
  return "the run directory holds what was finished; no checkpoint had been written yet";
}

}  // namespace commands
