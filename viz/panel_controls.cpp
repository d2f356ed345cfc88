// Controls: the run's state, play / pause / step / speed, and the settings of the next run.
// Settings use PyTorch's names. They take effect when the run is reset (Apply or R), because a
// change of world size or batch size means a different training from the first step on.
//
// Adding a setting (e.g. an allreduce algorithm or a parallelism mode once RunConfig has it): one
// block in draw_settings() reading and writing lab::RunConfig, and its checks in
// data/settings_check.cpp, which grey it out with the reason when it cannot apply.
#include <algorithm>
#include <cmath>

#include "draw.h"
#include "panels.h"

namespace viz {

namespace {

ImVec4 severity_color(Severity s) {
  return ImGui::ColorConvertU32ToFloat4(s == Severity::Error ? col::kError : s == Severity::Warning ? col::kWarn : col::kDim);
}

// A marker after a control when a check concerns its setting.
void check_marker(const std::vector<SettingCheck>& checks, const char* setting) {
  const SettingCheck* c = nullptr;
  for (const SettingCheck& x : checks)
    if (x.setting == setting && (!c || static_cast<int>(x.severity) > static_cast<int>(c->severity))) c = &x;
  if (!c) return;
  ImGui::SameLine();
  ImGui::TextColored(severity_color(c->severity), "%s", c->severity == Severity::Note ? "(i)" : "(!)");
  tooltip(c->message);
}

void draw_status(const RunData& d) {
  const char* phase = run_phase_name(d.phase);
  ImU32 c = col::kText;
  if (d.phase == RunPhase::Failed) c = col::kError;
  else if (d.phase == RunPhase::Paused) c = col::kWarn;
  else if (d.phase == RunPhase::Running) c = col::kGood;
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(c), "%s", phase);
  tooltip(d.live ? "The live run's state. Paused: every rank waits at its next gate (a ring step or the start of an "
                   "iteration); paused time does not count towards collective timeouts."
                 : "A finished run, read from its run directory " + d.source);
  const int64_t done = d.steps_done();
  const int64_t spe = std::max<int64_t>(1, d.steps_per_epoch);
  ImGui::SameLine();
  labeled_value("iteration", fmt("%lld / %lld", static_cast<long long>(done), static_cast<long long>(d.steps_total)),
                fmt("Iterations every rank has finished / planned.\nplanned = steps per epoch x epochs = %lld x %lld "
                    "(or --steps)",
                    static_cast<long long>(d.steps_per_epoch), static_cast<long long>(d.cfg.epochs)));
  labeled_value("epoch", fmt("%lld", static_cast<long long>(done / spe + (done % spe || !done ? 1 : 0))),
                fmt("epoch = iteration / steps per epoch + 1 = %lld / %lld + 1", static_cast<long long>(done),
                    static_cast<long long>(spe)));
  ImGui::SameLine();
  labeled_value("samples/s", fmt_count(d.samples_per_s),
                fmt("Training throughput: samples of every rank per second of wall clock (evaluation excluded%s).\n"
                    "= iterations x world_size x batch_size / seconds = %lld x %d x %lld / ...",
                    d.summary.valid ? ", from summary.json" : "", static_cast<long long>(done), d.cfg.world_size,
                    static_cast<long long>(d.cfg.batch_size)));
}

void draw_run_buttons(const RunData& d, double delay_s, ControlsState& st, Commands& cmd) {
  const bool live = d.live;
  const bool active = d.phase == RunPhase::Running || d.phase == RunPhase::Paused;
  const bool paused = d.phase == RunPhase::Paused;
  const float w = ImGui::GetFontSize() * 6.5f;
  ImGui::BeginDisabled(!live || !active);
  if (paused) {
    if (ImGui::Button("\xe2\x96\xb6 Play", ImVec2(w, 0))) cmd.play = true;  // U+25B6
    tooltip("Resume training at full speed (or the slow-motion speed below). Key: Space");
  } else {
    if (ImGui::Button("\xe2\x9d\x9a\xe2\x9d\x9a Pause", ImVec2(w, 0))) cmd.pause = true;  // U+275A x2
    tooltip("Every rank stops at its next gate: before its next ring step or iteration. Key: Space");
  }
  ImGui::EndDisabled();
  ImGui::SameLine();
  if (ImGui::Button(live ? "\xe2\x86\xba Reset" : "Run these settings", ImVec2(w * (live ? 1.0f : 1.6f), 0)))
    cmd.reset = true;
  tooltip(live ? "Stop this run and start a new one with the settings below. Key: R"
               : "Start a live run with the settings below (from the run directory's config.toml).");

  ImGui::BeginDisabled(!live || !active);
  ImGui::TextUnformatted("Step");
  ImGui::SameLine();
  if (ImGui::SmallButton("ring step")) cmd.step_ring = true;
  tooltip("Pause, then let every rank take one step of a collective: send one chunk to its ring neighbour and "
          "receive one. Key: Right arrow");
  ImGui::SameLine();
  if (ImGui::SmallButton("allreduce")) cmd.step_allreduce = true;
  tooltip("Pause, then let every rank finish its current (or next) allreduce: 2(N-1) ring steps.");
  ImGui::SameLine();
  if (ImGui::SmallButton("iteration")) cmd.step_iteration = true;
  tooltip("Pause, then let every rank finish its current (or next) iteration: forward, backward with the gradient "
          "allreduces, optimizer step. Key: Shift+Right");
  ImGui::SameLine();
  if (ImGui::SmallButton("epoch")) cmd.step_epoch = true;
  tooltip("Pause, then run to the end of the current epoch (including its evaluation).");
  ImGui::EndDisabled();

  // Speed: a wait at every gate, on a log scale from 0 (full speed) to 1 s.
  float ms = st.delay_ms;
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 12);
  ImGui::BeginDisabled(!live);
  if (ImGui::SliderFloat("speed", &ms, 0.0f, 1000.0f, ms <= 0.5f ? "full speed" : "%.0f ms per step",
                         ImGuiSliderFlags_Logarithmic)) {
    st.delay_ms = ms < 0.5f ? 0.0f : ms;
    cmd.delay_s = st.delay_ms / 1000.0;
  }
  ImGui::EndDisabled();
  tooltip(fmt("Slow motion: every rank waits this long before each ring step and each iteration (now %.0f ms). "
              "0 is full speed. Bandwidth figures include the wait.",
              delay_s * 1000));
}

// One block per setting. Returns nothing: edits go to st.pending.
void draw_settings(const RunData& d, ControlsState& st, bool compare_bn, Commands& cmd) {
  lab::RunConfig& c = st.pending;
  const std::vector<SettingCheck>& checks = st.checks;
  const float w = ImGui::GetFontSize() * 8;

  ImGui::TextUnformatted("model");
  ImGui::SameLine();
  if (ImGui::RadioButton("mlp", c.model == "mlp")) c.model = "mlp";
  tooltip("784-256-128-10 with BatchNorm1d after each hidden Linear: fast");
  ImGui::SameLine();
  if (ImGui::RadioButton("cnn", c.model == "cnn")) c.model = "cnn";
  tooltip("two 3x3 conv layers with BatchNorm2d, then two Linear layers: about 15x slower per sample");

  int world = c.world_size;
  ImGui::SetNextItemWidth(w);
  if (ImGui::SliderInt("world_size", &world, 1, 16)) c.world_size = world;
  tooltip("Number of ranks (emulated as threads), each with its own model replica, optimizer and data shard.");
  check_marker(checks, "world_size");

  int bs = static_cast<int>(c.batch_size);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt("batch_size", &bs, 1, 8)) c.batch_size = std::max(1, bs);
  tooltip(fmt("Per-rank batch size (DataLoader batch_size). The global batch is world_size x batch_size = %d x %lld "
              "= %lld.",
              c.world_size, static_cast<long long>(c.batch_size),
              static_cast<long long>(c.world_size) * static_cast<long long>(c.batch_size)));
  check_marker(checks, "batch_size");

  int limit = static_cast<int>(c.limit_train);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt("samples", &limit, 1, 100)) c.limit_train = std::max(0, limit);
  tooltip("Use only the first N training samples (0: all 60,000). Small numbers make padding and short last batches "
          "easy to see in the batching view.");

  ImGui::Checkbox("drop_last (DataLoader)", &c.drop_last);
  tooltip("DataLoader drop_last=True: drop each rank's last incomplete batch.");
  check_marker(checks, "drop_last");
  ImGui::Checkbox("drop_last (DistributedSampler)", &c.sampler_drop_last);
  tooltip("DistributedSampler drop_last=True: cut the tail of the shuffled list to a multiple of world_size instead "
          "of padding it with samples from its head.");
  check_marker(checks, "sampler_drop_last");
  ImGui::Checkbox("shuffle", &c.shuffle);
  tooltip("DistributedSampler shuffle: one permutation per epoch, seeded by seed + epoch, the same on every rank.");
  int seed = static_cast<int>(c.seed);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt("seed", &seed)) c.seed = static_cast<uint64_t>(std::max(0, seed));
  tooltip("torch.manual_seed for the initial weights and the DistributedSampler's seed.");

  ImGui::TextUnformatted("BatchNorm");
  ImGui::SameLine();
  if (ImGui::RadioButton("local", c.bn == "local")) c.bn = "local";
  tooltip("nn.BatchNorm under DDP: every rank normalizes with its own batch's statistics.");
  ImGui::SameLine();
  ImGui::BeginDisabled(c.world_size == 1 && c.bn != "sync");
  if (ImGui::RadioButton("sync", c.bn == "sync")) c.bn = "sync";
  ImGui::EndDisabled();
  tooltip(c.world_size == 1 ? "SyncBatchNorm has no effect with world_size 1: the global batch is the only rank's "
                              "batch."
                            : "nn.SyncBatchNorm: statistics of the global batch (count-weighted over ranks).");
  check_marker(checks, "bn");

  ImGui::BeginDisabled(c.world_size == 1);
  ImGui::Checkbox("broadcast_buffers", &c.broadcast_buffers);
  ImGui::EndDisabled();
  tooltip(c.world_size == 1 ? "No effect with one rank: there is nobody to broadcast to."
                            : "DDP broadcast_buffers: rank 0's BatchNorm running statistics overwrite every rank's "
                              "before each forward.");

  float lr = static_cast<float>(c.lr);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputFloat("lr", &lr, 0.01f, 0.1f, "%.4g")) c.lr = std::max(0.0f, lr);
  tooltip("SGD learning rate.");
  check_marker(checks, "lr");
  float mom = static_cast<float>(c.momentum);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputFloat("momentum", &mom, 0.05f, 0.1f, "%.3g")) c.momentum = std::clamp(mom, 0.0f, 0.999f);
  tooltip("SGD momentum.");
  int epochs = static_cast<int>(c.epochs);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt("epochs", &epochs)) c.epochs = std::clamp(epochs, 1, 1000);
  tooltip("Passes over the training set.");
  int every = static_cast<int>(c.eval_every);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt("eval every", &every, 10, 50)) c.eval_every = std::max(0, every);
  tooltip("Every N iterations, evaluate a copy of rank 0's model on the first test samples in eval mode (running "
          "statistics) and train mode (batch statistics): the train vs eval view. 0: off.");

  bool same = c.model == d.cfg.model && c.world_size == d.cfg.world_size && c.batch_size == d.cfg.batch_size &&
              c.limit_train == d.cfg.limit_train && c.drop_last == d.cfg.drop_last &&
              c.sampler_drop_last == d.cfg.sampler_drop_last && c.shuffle == d.cfg.shuffle && c.seed == d.cfg.seed &&
              c.bn == d.cfg.bn && c.broadcast_buffers == d.cfg.broadcast_buffers && c.lr == d.cfg.lr &&
              c.momentum == d.cfg.momentum && c.epochs == d.cfg.epochs && c.eval_every == d.cfg.eval_every;
  const SettingCheck* err = nullptr;
  for (const SettingCheck& x : checks)
    if (x.severity == Severity::Error) err = &x;
  ImGui::BeginDisabled(err != nullptr || (same && d.live));
  if (ImGui::Button("Apply (restarts the run)")) cmd.apply_settings = true;
  ImGui::EndDisabled();
  if (err) tooltip("Cannot run these settings: " + err->message);
  else if (same && d.live) tooltip("These are the running settings.");
  else tooltip("Stop the current run and start one with these settings.");
  if (!same && d.live) {
    ImGui::SameLine();
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kWarn), "changed");
  }
  for (const SettingCheck& x : checks) {
    ImGui::PushTextWrapPos(0);
    ImGui::TextColored(severity_color(x.severity), "%s %s",
                       x.severity == Severity::Error ? "error:" : x.severity == Severity::Warning ? "warning:" : "note:",
                       x.message.c_str());
    ImGui::PopTextWrapPos();
  }

  ImGui::Separator();
  bool cmp = compare_bn;
  ImGui::BeginDisabled(!d.live || d.cfg.world_size == 1);
  if (ImGui::Checkbox(fmt("twin run with bn=%s", d.cfg.bn == "sync" ? "local" : "sync").c_str(), &cmp))
    cmd.compare_bn = cmp;
  ImGui::EndDisabled();
  tooltip(d.cfg.world_size == 1 ? "With one rank local and sync BatchNorm are the same."
                                : "Train a second run with the other BatchNorm mode, the same seed and the same data "
                                  "order, stepped together with this one; the BatchNorm view shows both side by side. "
                                  "It shares the CPU, so both run at about half speed.");
}

}  // namespace

void draw_controls_panel(const RunData& d, ControlsState& st, bool compare_bn, double delay_s, Commands& cmd) {
  heading(d.live ? "Live run" : "Run directory");
  if (!d.live) ImGui::TextWrapped("%s", d.source.c_str());
  draw_status(d);
  draw_run_buttons(d, delay_s, st, cmd);
  if (d.phase == RunPhase::Failed) {
    text_wrapped_colored(col::kError, d.error);
    if (!d.error_hint.empty()) text_wrapped_colored(col::kWarn, "hint: " + d.error_hint);
  }
  if (d.summary.valid) {
    labeled_value("final test acc", fmt("%.4f eval / %.4f train mode", d.summary.eval_acc, d.summary.train_acc),
                  "Rank 0's final model on the whole test set: eval mode (running statistics) and train mode (batch "
                  "statistics of test batches of batch_size, on a copy).");
  }
  ImGui::Separator();
  heading("Settings");
  ImGui::SameLine();
  ImGui::TextDisabled("(next run)");
  draw_settings(d, st, compare_bn, cmd);
}

}  // namespace viz
