#include "train_eval_series.h"

#include <algorithm>

namespace viz {

namespace {

const char* kHowToGetCurves =
    "For eval and train mode side by side as training goes, train with --eval-every N (Settings: eval every): every "
    "N iterations, and after iterations 1, 2, 4, 8, ... before that, a copy of rank 0's model is then tested in both "
    "modes on the first --eval-samples test samples.";

std::string test_samples(const RunData& d) {
  return d.test_size > 0 ? "all " + std::to_string(d.test_size) + " test samples" : "every test sample";
}

}  // namespace

TrainEvalSeries train_eval_series(const RunData& d) {
  TrainEvalSeries s;
  for (const lab::EvalPoint& p : d.evals) {
    s.x.push_back(static_cast<float>(p.steps));
    s.eval_acc.push_back(static_cast<float>(p.eval_mode.acc));
    s.train_acc.push_back(static_cast<float>(p.train_mode.acc));
    s.eval_loss.push_back(static_cast<float>(p.eval_mode.loss));
    s.train_loss.push_back(static_cast<float>(p.train_mode.loss));
  }
  for (const lab::EpochRecord& e : d.epochs) {
    s.epoch_x.push_back(static_cast<float>(e.steps));
    s.epoch_acc.push_back(static_cast<float>(e.test_acc));
    s.epoch_loss.push_back(static_cast<float>(e.test_loss));
  }
  if (d.summary.valid) {
    const float at = static_cast<float>(d.summary.steps > 0 ? d.summary.steps : d.steps_done());
    if (std::find(s.epoch_x.begin(), s.epoch_x.end(), at) == s.epoch_x.end()) {
      s.final_eval_x.push_back(at);
      s.final_eval_acc.push_back(static_cast<float>(d.summary.eval_mode.acc));
      s.final_eval_loss.push_back(static_cast<float>(d.summary.eval_mode.loss));
    }
    s.final_train_x.push_back(at);
    s.final_train_acc.push_back(static_cast<float>(d.summary.train_mode.acc));
    s.final_train_loss.push_back(static_cast<float>(d.summary.train_mode.loss));
  }

  if (!s.x.empty()) return s;
  const bool past = d.opened();
  if (!s.empty()) {
    // what the run has: its epoch ends (and its end, in both modes)
    const std::string was = past ? "was" : "is";
    std::string what;
    if (!s.epoch_x.empty()) {
      what = was + " tested only where each epoch ended (white dots: eval mode, on " + test_samples(d) + ")";
      if (!s.final_train_x.empty()) what += ", and at its end in train mode too (orange dot)";
    } else {
      what = was + " tested only at its end, on " + test_samples(d) + ": eval mode (white dot) and train mode "
             "(orange dot)";
    }
    s.note = "Without --eval-every this run " + what + ". " + kHowToGetCurves;
    return s;
  }
  if (past) {
    s.note = "This run directory holds no evaluation: the run stopped before its first epoch ended" +
             std::string(d.cfg.eval_every > 0 ? " and before its first periodic evaluation." : ", and it had no --eval-every.");
  } else if (d.cfg.eval_every > 0) {
    s.note = "The first evaluation comes after iteration 1 (then 2, 4, 8, ... and every " +
             std::to_string(d.cfg.eval_every) + "), in eval and train mode.";
  } else {
    s.note = "Periodic evaluation is off (--eval-every 0): the first point comes where epoch 1 ends" +
             (d.steps_per_epoch > 0 ? ", after iteration " + std::to_string(d.steps_per_epoch) : std::string()) +
             " (eval mode, on " + test_samples(d) + "). " + kHowToGetCurves;
  }
  return s;
}

}  // namespace viz
