// What the views draw from (viz/data/run_data.h): steps by iteration and rank, what an opened run
// says it is, and the train-versus-eval series (viz/data/train_eval_series.h) with its epoch ends.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "run_data.h"
#include "test_util.h"
#include "train_eval_series.h"

namespace {

// A run of `steps` iterations on 2 ranks, `per_epoch` to an epoch, with an epoch record where each
// epoch ended, as load_run_dir (opened) or a live run's snapshot (live) leaves it.
viz::RunData run_with_epochs(bool opened, int64_t steps, int64_t per_epoch) {
  viz::RunData d;
  d.cfg.world_size = 2;
  d.live = !opened;
  d.phase = opened ? viz::RunPhase::Opened : viz::RunPhase::Running;
  d.source = opened ? "/runs/r1" : "live";
  d.steps_per_epoch = per_epoch;
  d.test_size = 500;
  std::vector<lab::StepRecord> recs;
  for (int64_t s = 0; s < steps; ++s)
    for (int r = 0; r < 2; ++r) {
      lab::StepRecord rec;
      rec.rank = r;
      rec.step = s;
      rec.epoch = s / per_epoch;
      rec.batch = s % per_epoch;
      recs.push_back(rec);
    }
  d.add_steps(recs);
  for (int64_t e = 0; (e + 1) * per_epoch <= steps; ++e) {
    lab::EpochRecord r;
    r.epoch = e;
    r.steps = (e + 1) * per_epoch;
    r.test_acc = 0.7 + 0.1 * static_cast<double>(e);
    r.test_loss = 0.6 - 0.1 * static_cast<double>(e);
    d.epochs.push_back(r);
  }
  return d;
}


}  // namespace

TEST(VizRunData, StepsByIterationAndRankWithBoundedBatchNormHistory) {
  viz::RunData d;
  d.cfg.world_size = 2;
  std::vector<lab::StepRecord> recs;
  const size_t steps = viz::RunData::kMaxBnSteps * 3;
  for (size_t s = 0; s < steps; ++s)
    for (int r = 0; r < 2; ++r) {
      lab::StepRecord rec;
      rec.rank = r;
      rec.step = static_cast<int64_t>(s);
      rec.bn.resize(1);
      rec.bn[0].batch_mean = {1.0f};
      recs.push_back(rec);
    }
  d.add_steps(recs);
  EXPECT_EQ(d.steps_done(), static_cast<int64_t>(steps));
  EXPECT_EQ(d.last_complete_step(), static_cast<int64_t>(steps) - 1);
  ASSERT_NE(d.record(5, 1), nullptr);
  EXPECT_EQ(d.record(5, 1)->rank, 1);
  size_t with_bn = 0;
  for (const auto& row : d.by_step) with_bn += !row[0].bn.empty();
  EXPECT_LE(with_bn, viz::RunData::kMaxBnSteps);
  EXPECT_FALSE(d.by_step.back()[0].bn.empty()) << "the newest steps keep their statistics";
  EXPECT_FALSE(d.by_step.front()[0].bn.empty()) << "thinning keeps every stride-th step, the first included";
}

// What the controls say instead of the run buttons for a run opened from its directory, and what
// the views say when they have nothing: a live run has nothing yet; a directory never will.
TEST(VizRunData, AnOpenedRunSaysWhatItIs) {
  viz::RunData d = run_with_epochs(true, 64, 32);
  EXPECT_TRUE(d.opened());
  EXPECT_EQ(d.opened_description(), "unfinished run (no summary.json: it failed or was stopped), opened from "
                                    "/runs/r1: 64 iterations, 2 epochs of 32 iterations");
  d.summary.valid = true;
  EXPECT_EQ(d.opened_description(), "finished run, opened from /runs/r1: 64 iterations, 2 epochs of 32 iterations");
  EXPECT_EQ(d.state_text(), "finished run, from its run directory");
  EXPECT_EQ(viz::nothing_recorded(d, "collectives", "Press Play."),
            "This run directory holds no collectives: the run stopped before any, or its trace.json is missing.");
  d.events.assign(2, {});
  d.events[1].push_back(lab::Event{});
  EXPECT_EQ(viz::nothing_recorded(d, "collectives", "Press Play."),
            "This run directory's trace holds none of the collectives chosen here.");

  const viz::RunData live = run_with_epochs(false, 10, 32);
  EXPECT_FALSE(live.opened());
  EXPECT_EQ(live.opened_description(), "");
  EXPECT_EQ(live.state_text(), "running");
  EXPECT_EQ(viz::nothing_recorded(live, "collectives", "Press Play."), "No collectives recorded yet. Press Play.");
}

// A run without --eval-every has its epoch ends (eval mode) and its end (both modes): the view
// draws them where they were taken, and says what --eval-every would add.
TEST(VizTrainEval, WithoutEvalEveryTheEpochEndsAtTheirIterations) {
  viz::RunData d = run_with_epochs(true, 64, 32);
  d.summary.valid = true;
  d.summary.steps = 64;
  d.summary.eval_mode.acc = 0.8;
  d.summary.train_mode.acc = 0.79;
  d.summary.train_mode.loss = 0.55;
  viz::TrainEvalSeries t = viz::train_eval_series(d);
  EXPECT_TRUE(t.x.empty());
  EXPECT_EQ(t.epoch_x, (std::vector<float>{32, 64}));
  EXPECT_FLOAT_EQ(t.epoch_acc[1], 0.8f);
  EXPECT_FLOAT_EQ(t.epoch_loss[0], 0.6f);
  EXPECT_TRUE(t.final_eval_x.empty()) << "the last epoch's evaluation is the end of the run's";
  EXPECT_EQ(t.final_train_x, (std::vector<float>{64}));
  EXPECT_FLOAT_EQ(t.final_train_acc[0], 0.79f);
  EXPECT_NE(t.note.find("was tested only where each epoch ended (white dots: eval mode, on all 500 test samples), "
                        "and at its end in train mode too"),
            std::string::npos)
      << t.note;
  EXPECT_NE(t.note.find("--eval-every N"), std::string::npos) << t.note;

  // --steps ending mid-epoch: no epoch ended at the last iteration, so its eval mode point is drawn too
  d.summary.steps = 70;
  t = viz::train_eval_series(d);
  EXPECT_EQ(t.final_eval_x, (std::vector<float>{70}));
  EXPECT_FLOAT_EQ(t.final_eval_acc[0], 0.8f);
  // no epoch ended at all: only the end of the run
  d.epochs.clear();
  t = viz::train_eval_series(d);
  EXPECT_NE(t.note.find("was tested only at its end, on all 500 test samples"), std::string::npos) << t.note;

  // periodic evaluations: the curves, nothing to add
  lab::EvalPoint p;
  p.steps = 1;
  d.evals.push_back(p);
  t = viz::train_eval_series(d);
  EXPECT_EQ(t.x, (std::vector<float>{1}));
  EXPECT_EQ(t.note, "");
}

// Before any evaluation: when the first point will come (live), or that there is none (opened).
TEST(VizTrainEval, NothingYetSaysWhenTheFirstPointComes) {
  viz::RunData live = run_with_epochs(false, 10, 32);
  viz::TrainEvalSeries t = viz::train_eval_series(live);
  EXPECT_TRUE(t.empty());
  EXPECT_NE(t.note.find("Periodic evaluation is off (--eval-every 0): the first point comes where epoch 1 ends, after "
                        "iteration 32"),
            std::string::npos)
      << t.note;
  live.cfg.eval_every = 50;
  EXPECT_EQ(viz::train_eval_series(live).note,
            "The first evaluation comes after iteration 1 (then 2, 4, 8, ... and every 50), in eval and train mode.");
  const viz::RunData opened = run_with_epochs(true, 10, 32);
  EXPECT_NE(viz::train_eval_series(opened).note.find("This run directory holds no evaluation"), std::string::npos);
}
