// Controls: the live run's state, play / pause / step / speed, and the settings of the next run. A
// run opened from its run directory (--open, File > Open, a lesson's prepared runs) cannot move:
// it gets what it is instead ("finished run, opened from DIR: 64 iterations, 2 epochs of 32
// iterations") and a button to train its settings live; the views' own sliders move through it.
// Settings use PyTorch's names. They take effect when the run is reset (Apply or R), because a
// change of world size or batch size means a different training from the first step on.
//
// Adding a setting: one block in draw_settings() reading and writing lab::RunConfig, and its rules
// in data/settings_check.cpp (apply_choice, check_settings) and lab/core/config_effects.cpp
// (no_effect_reason, shared with the CLI): a choice that lab::validate would refuse, or that has
// no effect, is greyed out with the reason in its tooltip.
#include <algorithm>
#include <cmath>

#include "config_effects.h"
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
  tooltip("The live run's state. Paused: every rank waits at its next gate (a ring step or the start of an "
          "iteration); paused time does not count towards collective timeouts.");
  note_item("value", "state", true, phase);
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

// A live run: play / pause, the step buttons and the speed; they act while it trains (greyed out
// once it has ended: Reset starts the next one).
void draw_run_buttons(const RunData& d, double delay_s, ControlsState& st, Commands& cmd) {
  const bool active = d.phase == RunPhase::Running || d.phase == RunPhase::Paused;
  const bool paused = d.phase == RunPhase::Paused;
  const float w = ImGui::GetFontSize() * 6.5f;
  ImGui::BeginDisabled(!active);
  if (paused) {
    if (ImGui::Button("\xe2\x96\xb6 Play", ImVec2(w, 0))) cmd.play = true;  // U+25B6
    tooltip("Resume training at full speed (or the slow-motion speed below). Key: Space");
    note_item("button", "Play", active);
  } else {
    if (ImGui::Button("\xe2\x9d\x9a\xe2\x9d\x9a Pause", ImVec2(w, 0))) cmd.pause = true;  // U+275A x2
    tooltip("Every rank stops at its next gate: before its next ring step or iteration. Key: Space");
    note_item("button", "Pause", active);
  }
  ImGui::EndDisabled();
  ImGui::SameLine();
  if (ImGui::Button("\xe2\x86\xba Reset", ImVec2(w, 0))) cmd.reset = true;
  tooltip("Stop this run and start a new one with the settings below. Key: R");
  note_item("button", "Reset");

  ImGui::BeginDisabled(!active);
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
  for (const char* b : {"ring step", "allreduce", "iteration", "epoch"}) note_item("button", b, active);

  // Speed: a wait at every gate, on a log scale from 0 (full speed) to 1 s.
  float ms = st.delay_ms;
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 12);
  if (ImGui::SliderFloat("speed", &ms, 0.0f, 1000.0f, ms <= 0.5f ? "full speed" : "%.0f ms per step",
                         ImGuiSliderFlags_Logarithmic)) {
    st.delay_ms = ms < 0.5f ? 0.0f : ms;
    cmd.delay_s = st.delay_ms / 1000.0;
  }
  tooltip(fmt("Slow motion: every rank waits this long before each ring step and each iteration (now %.0f ms). "
              "0 is full speed. Bandwidth figures include the wait.",
              delay_s * 1000));
  note_item("slider", "speed");
}

// A run opened from its run directory is a recording: no play, pause, step or speed (nothing
// trains), but what it is, and a way to train its settings live.
void draw_opened_run(const RunData& d, Commands& cmd) {
  const std::string what = d.opened_description();
  ImGui::PushFont(font(FontId::Bold));
  ImGui::TextWrapped("%s", what.c_str());
  ImGui::PopFont();
  note_item("heading", what);
  if (d.summary.valid) {
    labeled_value("samples/s", fmt_count(d.samples_per_s),
                  fmt("Training throughput from summary.json: samples of every rank per second of wall clock "
                      "(evaluation excluded), over %.2f s of training.",
                      d.summary.train_seconds));
  }
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  const bool ring = d.world() > 1 && !d.caps().parameter_server;  // the server's view has no steps to move through
  const std::string why = std::string("A recording: nothing trains here, so there is nothing to pause, step or slow "
                                      "down. Move through what the run directory holds with the views' own controls (") +
                          (ring ? "the Allreduce view's steps, " : "") +
                          "the BatchNorm view's iteration, the Batching view's epoch, the Timeline's window).";
  ImGui::TextWrapped("%s", why.c_str());
  ImGui::PopStyleColor();
  note_item("text", why);
  if (ImGui::Button("Train these settings live")) cmd.reset = true;
  tooltip("Start a new live run with the settings below (they start as this run's config.toml): then Play, Pause, "
          "the step buttons and the speed act on it. Key: R");
  note_item("button", "Train these settings live");
}

// Whether a choice is greyed out, and its tooltip: what it is, then why it cannot be chosen.
struct Offer {
  bool disabled = false;
  std::string tip;
};
Offer offer(const lab::RunConfig& c, const char* setting, const std::string& value, bool selected,
            const std::string& what) {
  const std::string why = unavailable_reason(c, setting, value);
  Offer o;
  o.disabled = !why.empty() && !selected;
  o.tip = why.empty() ? what : what + "\n\nNot available here: " + why;
  return o;
}

// A radio button for setting = value, greyed out when that cannot be chosen here.
void choice_radio(lab::RunConfig& c, const char* label, const char* setting, const char* value, bool selected,
                  const std::string& what) {
  const Offer o = offer(c, setting, value, selected, what);
  ImGui::BeginDisabled(o.disabled);
  if (ImGui::RadioButton(label, selected)) apply_choice(c, setting, value);
  ImGui::EndDisabled();
  tooltip(o.tip);
}

// A checkbox for a boolean setting: greyed out when the other value cannot be chosen.
void choice_checkbox(lab::RunConfig& c, const char* label, const char* setting, bool& v, const std::string& what) {
  const Offer o = offer(c, setting, v ? "false" : "true", false, what);
  ImGui::BeginDisabled(o.disabled);
  bool x = v;
  if (ImGui::Checkbox(label, &x)) apply_choice(c, setting, x ? "true" : "false");
  ImGui::EndDisabled();
  tooltip(o.tip);
}

// An integer setting: greyed out when it has no effect here.
void choice_int(lab::RunConfig& c, const char* label, const char* setting, int64_t& v, int min, float width,
                const std::string& what) {
  const std::string none = lab::no_effect_reason(c, setting);
  ImGui::BeginDisabled(!none.empty());
  int x = static_cast<int>(v);
  ImGui::SetNextItemWidth(width);
  if (ImGui::InputInt(label, &x)) apply_choice(c, setting, std::to_string(std::max(min, x)));
  ImGui::EndDisabled();
  tooltip(none.empty() ? what : what + "\n\nNot available here: " + none);
}

bool same_settings(const lab::RunConfig& a, const lab::RunConfig& b) {
  bool same = a.model == b.model && a.world_size == b.world_size && a.batch_size == b.batch_size &&
              a.limit_train == b.limit_train && a.drop_last == b.drop_last && a.sampler_drop_last == b.sampler_drop_last &&
              a.shuffle == b.shuffle && a.seed == b.seed && a.bn == b.bn && a.broadcast_buffers == b.broadcast_buffers &&
              a.optimizer == b.optimizer && a.lr == b.lr && a.momentum == b.momentum && a.epochs == b.epochs &&
              a.eval_every == b.eval_every &&
              setting_value(a, "mode") == setting_value(b, "mode") && a.allreduce == b.allreduce;
  for (const lab::ParallelMode* m : lab::modes())  // every mode's own settings (mode.h)
    for (const lab::ModeSetting& s : m->settings()) same = same && setting_value(a, s.field) == setting_value(b, s.field);
  return same;
}

// One setting a mode shows (lab/modes/mode.h: ModeSetting).
void draw_mode_setting(lab::RunConfig& c, const lab::ModeSetting& s, const std::vector<SettingCheck>& checks, float w) {
  if (s.shown && !s.shown(c)) return;
  const std::string value = setting_value(c, s.field);
  if (s.kind == lab::ModeSetting::Kind::Int) {
    int64_t v = std::strtoll(value.c_str(), nullptr, 10);
    choice_int(c, s.label.c_str(), s.field.c_str(), v, static_cast<int>(s.min), w, s.help);
  } else if (s.kind == lab::ModeSetting::Kind::Bool) {
    bool v = value == "true";
    choice_checkbox(c, s.label.c_str(), s.field.c_str(), v, s.help);
  } else {
    ImGui::TextUnformatted(s.label.c_str());
    for (const auto& [choice, what] : s.choices) {
      ImGui::SameLine();
      choice_radio(c, choice.c_str(), s.field.c_str(), choice.c_str(), value == choice, what);
    }
  }
  check_marker(checks, s.field.c_str());
}

// Parallelism mode and communication: the modes of the registry (lab/modes/mode.h), the chosen
// mode's own settings, and the allreduce algorithm.
void draw_parallelism(lab::RunConfig& c, const std::vector<SettingCheck>& checks, float w) {
  ImGui::TextUnformatted("mode");
  const lab::ParallelMode* chosen = lab::find_mode(c.mode);
  // One line while they fit, the rest on the next (the registry grows: a clipped name is unreadable)
  const ImGuiStyle& style = ImGui::GetStyle();
  const float right = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
  for (const lab::ParallelMode* m : lab::modes()) {
    const float need = ImGui::GetFrameHeight() + style.ItemInnerSpacing.x + ImGui::CalcTextSize(m->name()).x;
    if (ImGui::GetItemRectMax().x + style.ItemSpacing.x + need <= right) ImGui::SameLine();
    choice_radio(c, m->name(), "mode", m->name(), m == chosen, m->about());
  }
  check_marker(checks, "mode");
  if (chosen)
    for (const lab::ModeSetting& s : chosen->settings()) draw_mode_setting(c, s, checks, w);
  ImGui::TextUnformatted("allreduce");
  ImGui::SameLine();
  const bool ar = c.allreduce == "ring";
  choice_radio(c, "ring", "allreduce", "ring", ar,
               "Ring: N-1 reduce-scatter steps then N-1 allgather steps, one chunk (1/N of the buffer) per step to the "
               "right neighbour: every rank sends 2(N-1)/N of the buffer, however many ranks there are.");
  ImGui::SameLine();
  choice_radio(c, "naive", "allreduce", "naive", c.allreduce == "naive",
               "Naive: every rank sends its whole buffer to rank 0, which adds them in rank order and sends the sum back "
               "(the parameter-server picture): rank 0's link carries 2(N-1) buffers.");
  ImGui::SameLine();
  choice_radio(c, "tree", "allreduce", "tree", c.allreduce == "tree",
               "Tree: recursive halving-doubling (Rabenseifner), log2 N steps each way; for buffers up to 64 KiB "
               "recursive doubling, log2 N steps of the whole buffer.");
  ImGui::SameLine();
  choice_radio(c, "mpi", "allreduce", "mpi", c.allreduce == "mpi", "The MPI library's own allreduce.");
  check_marker(checks, "allreduce");
}

// One block per setting. Returns nothing: edits go to st.pending.
void draw_settings(const RunData& d, ControlsState& st, bool compare_bn, Commands& cmd) {
  lab::RunConfig& c = st.pending;
  const std::vector<SettingCheck>& checks = st.checks;
  const float w = ImGui::GetFontSize() * 8;
  const bool dp = lab::mode_of(c).caps().master_device;  // DataParallel's words for its devices

  ImGui::TextUnformatted("model");
  ImGui::SameLine();
  choice_radio(c, "mlp", "model", "mlp", c.model == "mlp",
               "784-256-128-10 with BatchNorm1d after each hidden Linear: fast");
  ImGui::SameLine();
  choice_radio(c, "cnn", "model", "cnn", c.model == "cnn",
               "two 3x3 conv layers with BatchNorm2d, then two Linear layers: about 15x slower per sample");

  int world = c.world_size;
  ImGui::SetNextItemWidth(w);
  if (ImGui::SliderInt(dp ? "devices" : "world_size", &world, 1, 16)) c.world_size = world;
  tooltip(dp ? "DataParallel's devices (device_ids), emulated as threads of one process; device 0 is the master."
             : "Number of ranks (emulated as threads), each with its own model replica, optimizer and data shard.");
  check_marker(checks, "world_size");

  int bs = static_cast<int>(c.batch_size);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt(dp ? "batch_size (global)" : "batch_size", &bs, 1, 8)) c.batch_size = std::max(1, bs);
  tooltip(dp ? fmt("DataParallel's DataLoader batch_size: the global batch, split over the %d devices like torch.chunk "
                   "(ceil(%lld / %d) samples each, the last device the rest, or idle).",
                   c.world_size, static_cast<long long>(c.batch_size), c.world_size)
             : fmt("Per-rank batch size (DataLoader batch_size). The global batch is world_size x batch_size = %d x %lld "
                   "= %lld.",
                   c.world_size, static_cast<long long>(c.batch_size),
                   static_cast<long long>(c.world_size) * static_cast<long long>(c.batch_size)));
  check_marker(checks, "batch_size");

  int limit = static_cast<int>(c.limit_train);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt("samples", &limit, 1, 100)) c.limit_train = std::max(0, limit);
  tooltip("Use only the first N training samples (0: all 60,000). Small numbers make padding and short last batches "
          "easy to see in the batching view.");

  choice_checkbox(c, "drop_last (DataLoader)", "drop_last", c.drop_last,
                  dp ? "DataLoader drop_last=True: drop the last incomplete global batch."
                     : "DataLoader drop_last=True: drop each rank's last incomplete batch.");
  check_marker(checks, "drop_last");
  choice_checkbox(c, "drop_last (DistributedSampler)", "sampler_drop_last", c.sampler_drop_last,
                  "DistributedSampler drop_last=True: cut the tail of the shuffled list to a multiple of world_size "
                  "instead of padding it with samples from its head.");
  check_marker(checks, "sampler_drop_last");
  choice_checkbox(c, "shuffle", "shuffle", c.shuffle,
                  dp ? "DataLoader shuffle: one permutation per epoch from a generator seeded with seed."
                     : "DistributedSampler shuffle: one permutation per epoch, seeded by seed + epoch, the same on "
                       "every rank.");
  int seed = static_cast<int>(c.seed);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt("seed", &seed)) c.seed = static_cast<uint64_t>(std::max(0, seed));
  tooltip("torch.manual_seed for the initial weights and the data order's seed.");

  ImGui::TextUnformatted("BatchNorm");
  ImGui::SameLine();
  choice_radio(c, "local", "bn", "local", c.bn == "local",
               dp ? "nn.BatchNorm under DataParallel: every device normalizes with its own chunk's statistics; only "
                    "device 0's running statistics survive the next replicate."
                  : "nn.BatchNorm under DDP: every rank normalizes with its own batch's statistics.");
  ImGui::SameLine();
  if (c.world_size == 1 && c.bn != "sync") {
    ImGui::BeginDisabled();
    ImGui::RadioButton("sync", false);
    ImGui::EndDisabled();
    tooltip("SyncBatchNorm has no effect with world_size 1: the global batch is the only rank's batch.");
  } else {
    choice_radio(c, "sync", "bn", "sync", c.bn == "sync",
                 "nn.SyncBatchNorm: statistics of the global batch (count-weighted over ranks).");
  }
  check_marker(checks, "bn");

  choice_checkbox(c, "broadcast_buffers", "broadcast_buffers", c.broadcast_buffers,
                  "DDP broadcast_buffers: rank 0's BatchNorm running statistics overwrite every rank's before each "
                  "forward.");
  check_marker(checks, "broadcast_buffers");

  draw_parallelism(c, checks, w);

  ImGui::TextUnformatted("optimizer");
  ImGui::SameLine();
  choice_radio(c, "sgd", "optimizer", "sgd", c.optimizer == "sgd", "torch.optim.SGD with momentum.");
  ImGui::SameLine();
  choice_radio(c, "adam", "optimizer", "adam", c.optimizer == "adam",
               "torch.optim.Adam (betas 0.9, 0.999; eps 1e-8): each parameter's step is its first moment over the "
               "square root of its second, so every weight moves by about lr. Its state, two tensors per "
               "parameter, is twice SGD's momentum.");
  ImGui::SameLine();
  choice_radio(c, "adamw", "optimizer", "adamw", c.optimizer == "adamw",
               "torch.optim.AdamW: Adam with the weight decay applied to the weights (w *= 1 - lr * weight_decay) "
               "instead of added to the gradient.");
  check_marker(checks, "optimizer");
  float lr = static_cast<float>(c.lr);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputFloat("lr", &lr, 0.01f, 0.1f, "%.4g")) c.lr = std::max(0.0f, lr);
  tooltip(c.optimizer == "sgd" ? "SGD learning rate." : "Adam's learning rate (PyTorch's default: 0.001).");
  check_marker(checks, "lr");
  float mom = static_cast<float>(c.momentum);
  const std::string no_momentum = lab::no_effect_reason(c, "momentum");
  ImGui::BeginDisabled(!no_momentum.empty());
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputFloat("momentum", &mom, 0.05f, 0.1f, "%.3g")) c.momentum = std::clamp(mom, 0.0f, 0.999f);
  ImGui::EndDisabled();
  tooltip(no_momentum.empty() ? "SGD momentum." : "SGD momentum.\n\nNot available here: " + no_momentum);
  int epochs = static_cast<int>(c.epochs);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt("epochs", &epochs)) c.epochs = std::clamp(epochs, 1, 1000);
  tooltip("Passes over the training set.");
  int every = static_cast<int>(c.eval_every);
  ImGui::SetNextItemWidth(w);
  if (ImGui::InputInt("eval every", &every, 10, 50)) c.eval_every = std::max(0, every);
  tooltip("Every N iterations, evaluate a copy of rank 0's model on the first test samples in eval mode (running "
          "statistics) and train mode (batch statistics): the train vs eval view. 0: off.");

  const bool same = same_settings(c, d.cfg);
  const SettingCheck* err = nullptr;
  for (const SettingCheck& x : checks)
    if (x.severity == Severity::Error) err = &x;
  const bool apply = err == nullptr && !(same && d.live);
  ImGui::BeginDisabled(!apply);
  const char* apply_label = d.live ? "Apply (restarts the run)" : "Apply (starts a live run)";
  if (ImGui::Button(apply_label)) cmd.apply_settings = true;
  ImGui::EndDisabled();
  note_item("button", apply_label, apply);
  if (err) tooltip("Cannot run these settings: " + err->message);
  else if (same && d.live) tooltip("These are the running settings.");
  else if (d.live) tooltip("Stop the current run and start one with these settings.");
  else tooltip("Start a live run with these settings.");
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
  // The twin trains beside the live run (restarting both), or beside the next one when none is live.
  bool cmp = compare_bn;
  const lab::RunConfig& tc = d.live ? d.cfg : c;
  const lab::ParallelMode* twin_mode = lab::find_mode(tc.mode);
  const bool twin_dp = !twin_mode || !twin_mode->caps().sync_bn;
  const bool twin_off = tc.world_size == 1 || twin_dp;
  const std::string twin_label = fmt("twin run with bn=%s", tc.bn == "sync" ? "local" : "sync");
  ImGui::BeginDisabled(twin_off);
  if (ImGui::Checkbox(twin_label.c_str(), &cmp)) cmd.compare_bn = cmp;
  ImGui::EndDisabled();
  note_item("checkbox", twin_label, !twin_off);
  tooltip(tc.world_size == 1 ? "With one rank local and sync BatchNorm are the same."
          : twin_dp          ? "--mode " + tc.mode + " has no SyncBatchNorm (it needs DistributedDataParallel): no twin run."
          : d.live           ? "Train a second run with the other BatchNorm mode, the same seed and the same data "
                               "order, stepped together with this one; the BatchNorm view shows both side by side. "
                               "It shares the CPU, so both run at about half speed."
                             : "With the next live run (Apply), train a second one with the other BatchNorm mode, the "
                               "same seed and the same data order, stepped together; the BatchNorm view shows both "
                               "side by side.");
}

}  // namespace

void draw_controls_panel(const RunData& d, ControlsState& st, bool compare_bn, double delay_s, Commands& cmd) {
  if (d.opened()) {
    draw_opened_run(d, cmd);
  } else if (d.live) {
    heading("Live run");
    draw_status(d);
    draw_run_buttons(d, delay_s, st, cmd);
    if (d.phase == RunPhase::Failed) {
      text_wrapped_colored(col::kError, d.error);
      if (!d.error_hint.empty()) text_wrapped_colored(col::kWarn, "hint: " + d.error_hint);
    }
  } else {  // nothing shown yet (a lesson before its runs)
    heading("No run");
    if (ImGui::Button("Train these settings live")) cmd.reset = true;
    tooltip("Start a live run with the settings below. Key: R");
    note_item("button", "Train these settings live");
  }
  if (d.cfg.compute.device != "cpu") {
    const bool sim = d.cfg.compute.device == "sim";
    std::string why = "--device " + d.cfg.compute.device +
                      (sim ? ": a simulated GPU: the GPU's protocol with the CPU's ops, so its times say nothing about "
                             "a GPU's; what it copied is what a GPU copies"
                           : ": every rank's forward and backward ran on the GPU (cuBLAS, cuDNN, the lab's kernels)") +
                      ". The parameters and their momentum live on the device and its optimizer steps them; "
                      "BatchNorm runs whole there (its running statistics come down only when something reads "
                      "them) and so does the loss; under DDP the gradients stay there too, reduced between the "
                      "ranks' device buckets (other modes take them down to the host and back)";
    if (d.summary.staged_bytes > 0)
      why += fmt(" (%.1f MB copied in all, see the timeline's device band)", static_cast<double>(d.summary.staged_bytes) / 1e6);
    why += ".";
    for (const std::string& a : d.summary.conv_algorithms) why += "\n" + a;
    labeled_value("device", d.summary.device_name.empty() ? d.cfg.compute.device : d.summary.device_name, why);
    if (d.cfg.compute.cuda_graphs)
      labeled_value("CUDA Graphs", d.summary.cuda_graphs.empty() ? "on" : d.summary.cuda_graphs,
                    "--cuda-graphs: the training step (forward, loss, backward, SGD) was captured once as a CUDA Graph "
                    "and replayed: one launch a step instead of one per kernel. The first step, and the first of a "
                    "new batch shape or learning rate, run kernel by kernel; the second is captured. The weights are "
                    "the step-by-step run's, bit for bit. The timeline's device band shows each replay as one span"
                    + std::string(d.cfg.compute.device == "sim" ? " (the simulated GPU captures nothing: it runs the "
                                                                  "step's calls one by one)" : "") + ".");
  }
  if (d.summary.valid) {
    labeled_value("final test acc", fmt("%.4f eval / %.4f train mode", d.summary.eval_mode.acc, d.summary.train_mode.acc),
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
