// TrainEvalSeries: the points of the Train vs eval view, from every evaluation a run has, each at
// the iteration it was taken (the number of iterations done then), and a sentence saying what the
// run has and what it would need for more. A run has up to three kinds of evaluation:
//   periodic     --eval-every N: a copy of rank 0's model on the first --eval-samples test samples,
//                in eval mode (running statistics) and train mode (batch statistics), after
//                iterations 1, 2, 4, ... and every N (metrics.jsonl "eval" records)
//   epoch end    every run: rank 0's model in eval mode on every test sample in use, where each
//                epoch ended (metrics.jsonl "epoch" records, summary.json per_epoch)
//   run end      summary.json: the final model in both modes on every test sample
// The same for a live run (its snapshot and status) and for one opened from its run directory.
#pragma once

#include <string>
#include <vector>

#include "run_data.h"

namespace viz {

struct TrainEvalSeries {
  // periodic evaluations: x = iterations done, in eval and train mode
  std::vector<float> x, eval_acc, train_acc, eval_loss, train_loss;
  // the end of each epoch, eval mode: x = the iteration the epoch ended at
  std::vector<float> epoch_x, epoch_acc, epoch_loss;
  // the end of the run (0 or 1 point each): eval mode only where no epoch ended at the same
  // iteration (the same evaluation), train mode always
  std::vector<float> final_eval_x, final_eval_acc, final_eval_loss;
  std::vector<float> final_train_x, final_train_acc, final_train_loss;
  // What the view has to say about the data: "" when periodic evaluations are there; else what the
  // points are and how to get the curves (--eval-every N), or when the first point will come.
  std::string note;

  bool empty() const { return x.empty() && epoch_x.empty() && final_eval_x.empty() && final_train_x.empty(); }
};

TrainEvalSeries train_eval_series(const RunData& d);

}  // namespace viz
