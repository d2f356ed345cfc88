// The panels of the lab window, one per file (panel_<name>.cpp). Each draws into the current
// ImGui window from const run data and its own view state, and asks for changes through
// Commands. The app (app.cpp) decides which window hosts which panel.
#pragma once

#include "app_state.h"

namespace viz {

// Run state, play / pause / step / speed, settings (applied by Reset), twin run.
void draw_controls_panel(const RunData& d, ControlsState& st, bool compare_bn, double delay_s, Commands& cmd);
// 1. Allreduce traffic (ring, naive, tree; DataParallel's reduce): ranks on a circle, transfers per step and phase.
void draw_ring_view(const RunData& d, RingViewState& st, const FrameClock& clock);
// 1'. --mode async: the workers round the parameter server, each push's staleness.
void draw_async_view(const RunData& d, AsyncViewState& st, const FrameClock& clock);
// 2. BatchNorm statistics: per-rank batch and running statistics, local versus sync.
void draw_batchnorm_view(const RunData& d, const RunData* twin, BnViewState& st, Commands& cmd);
// 3. Batching and drop_last: the epoch as a strip of dataset indices.
void draw_batching_view(const RunData& d, BatchingViewState& st);
// 4. Train versus eval: test accuracy with batch and running statistics over time.
void draw_train_eval_view(const RunData& d, TrainEvalViewState& st, BnViewState& bn);
// 5. Benchmarks: a bench train sweep (ms per sample against batch size, one sample at a time) or
// a bench chain (every order's time and FLOPs, thread scaling); twin: a second result beside it.
void draw_bench_view(const BenchResult& r, const BenchResult* twin, BenchViewState& st);
// 6. Memory: every rank's bytes by category at a point of a step, the step's curve, ZeRO's formula.
void draw_memory_view(const RunData& d, MemoryViewState& st);
// 7. Pipeline: stages by time, each micro-batch's forward and backward, the bubble three ways.
void draw_pipeline_view(const RunData& d, PipelineViewState& st);
// 8. Grid: the ranks on the grid of data, pipeline and tensor parallelism, their groups and each
// group's bytes in an iteration.
void draw_grid_view(const RunData& d, GridViewState& st);
// 9. Scale: collectives on 8 to 4,096 GPUs from the simulator (lab/sim): the topology, busbw and
// time against N with the time's latency / bandwidth / contention split, busbw against the size
// with the ring / tree crossover; the run's own allreduces against the simulator when it was
// trained with the link model.
void draw_scale_view(const RunData& d, ScaleViewState& st, const FrameClock& clock);
// Compute and communication per rank over time.
void draw_timeline_panel(const RunData& d, TimelineState& st);
// Loss and accuracy per rank.
void draw_ranks_panel(const RunData& d, RanksViewState& st);
// Warnings and errors.
void draw_log_panel(const LogBuffer& log, LogViewState& st);
// Lessons: the list, or the lesson being taken (predict, run, observe, results).
void draw_lessons_panel(LessonDriver* driver, LessonPanelState& st, bool teacher, Commands& cmd);
// Shortcuts and what each view shows (F1).
void draw_help_window(bool* open);

}  // namespace viz
