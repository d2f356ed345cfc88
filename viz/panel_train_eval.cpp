// View 4, train versus eval. model.train() normalizes with each batch's statistics, model.eval()
// with the running statistics BatchNorm accumulated during training. Early on the running
// statistics lag behind (they start at mean 0, variance 1 and move by momentum 0.1 per step), so
// the two modes disagree; as they converge, the curves meet. Shown: test accuracy and loss in both
// modes over iterations (periodic evaluations of a copy of rank 0's model: training is not
// disturbed), the same test image's outputs in both modes, and rank 0's running mean converging.
#include <algorithm>
#include <cmath>

#include "draw.h"
#include "panels.h"
#include "train_eval_series.h"

namespace viz {

namespace {

constexpr const char* kClasses[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

// Every evaluation the run has (train_eval_series.h), each at the iteration it was taken: the
// periodic curves of both modes, white dots where each epoch ended, and the end of the run in both
// modes where there are no periodic curves to end with (the periodic ones include the last
// iteration). The x axis starts at iteration 1 (log) or 0, so that a lone point lands where it was
// taken instead of at the left edge; without periodic curves it is linear.
void draw_curves(const RunData& d, const TrainEvalSeries& t, bool log_x, float height) {
  const int n = static_cast<int>(t.x.size());
  const int ne = static_cast<int>(t.epoch_x.size());
  const bool periodic = n > 0;
  const int64_t samples = d.evals.empty() ? 0 : d.evals.back().samples;
  std::vector<ChartSeries> acc, loss;
  if (periodic) {
    acc.push_back({"eval mode (running stats)", col::kEval, t.x.data(), t.eval_acc.data(), n, 2.0f, false, true});
    acc.push_back({"train mode (batch stats)", col::kTrain, t.x.data(), t.train_acc.data(), n, 2.0f, false, true});
    loss.push_back({"eval mode", col::kEval, t.x.data(), t.eval_loss.data(), n, 2.0f, false, true});
    loss.push_back({"train mode", col::kTrain, t.x.data(), t.train_loss.data(), n, 2.0f, false, true});
  }
  acc.push_back({"end of epoch, all test samples, eval mode", col::kGlobal, t.epoch_x.data(), t.epoch_acc.data(), ne, 3.0f, true});
  if (ne > 0) loss.push_back({"end of epoch, eval mode", col::kGlobal, t.epoch_x.data(), t.epoch_loss.data(), ne, 3.0f, true});
  if (!periodic) {
    const int fe = static_cast<int>(t.final_eval_x.size()), ft = static_cast<int>(t.final_train_x.size());
    if (fe > 0) {
      acc.push_back({"end of run, eval mode", col::kGlobal, t.final_eval_x.data(), t.final_eval_acc.data(), fe, 3.0f, true});
      loss.push_back({"end of run, eval mode", col::kGlobal, t.final_eval_x.data(), t.final_eval_loss.data(), fe, 3.0f, true});
    }
    if (ft > 0) {
      acc.push_back({"end of run, train mode", col::kTrain, t.final_train_x.data(), t.final_train_acc.data(), ft, 3.0f, true});
      loss.push_back({"end of run, train mode", col::kTrain, t.final_train_x.data(), t.final_train_loss.data(), ft, 3.0f, true});
    }
  }
  ChartOptions o;
  o.id = "te_acc";
  o.log_x = log_x && periodic;  // a log axis gives the early evaluations room; epoch ends are evenly spaced
  o.x_min = o.log_x ? 1.0f : 0.0f;
  if (!periodic) {  // dots only: room after the last, which would sit on the edge, half clipped
    float last = 0;
    for (const ChartSeries& s : acc)
      if (s.n > 0) last = std::max(last, s.x[s.n - 1]);
    if (last > 0) o.x_max = last + std::max(1.0f, std::ceil(last * 0.05f));
  }
  o.title = nullptr;
  o.size = ImVec2(0, height);
  o.y_max = 1.0f;
  o.hover_note = periodic
                     ? fmt("Accuracy on the first %lld test samples of a copy of rank 0's model. Train mode: batch "
                           "statistics of test batches of batch_size (%lld). Eval mode: the running statistics. White "
                           "dots: the end of each epoch, on every test sample.",
                           static_cast<long long>(samples), static_cast<long long>(d.cfg.batch_size))
                     : fmt("Rank 0's model on every test sample, where each epoch ended (eval mode: the running "
                           "statistics) and at the end of the run (also in train mode: batch statistics of test "
                           "batches of batch_size, %lld).",
                           static_cast<long long>(d.cfg.batch_size));
  ImGui::TextUnformatted("test accuracy");
  line_chart(o, acc);
  o.id = "te_loss";
  o.y_max = NAN;
  o.y_min = 0;
  o.hover_note = periodic ? "Mean cross-entropy on the same test samples." : "Mean cross-entropy on every test sample.";
  ImGui::TextUnformatted("test loss");
  line_chart(o, loss);
}

void draw_probe(const RunData& d, TrainEvalViewState& st) {
  if (d.evals.empty()) {
    heading("The same input in both modes");
    const char* why = d.cfg.eval_every > 0
                          ? "Test sample 0's outputs in eval and train mode come with the periodic evaluations: the "
                            "first after iteration 1."
                          : "Test sample 0's outputs in eval and train mode come with the periodic evaluations "
                            "(--eval-every N), which this run does not make.";
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("%s", why);
    ImGui::PopStyleColor();
    note_item("text", why);
    return;
  }
  const int count = static_cast<int>(d.evals.size());
  int idx = st.eval_index < 0 ? count - 1 : std::min(st.eval_index, count - 1);
  heading("The same input in both modes");
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 12);
  if (ImGui::SliderInt("evaluation", &idx, 0, count - 1, fmt("after %lld iterations", static_cast<long long>(d.evals[static_cast<size_t>(idx)].steps)).c_str()))
    st.eval_index = idx == count - 1 ? -1 : idx;
  tooltip("Which periodic evaluation to show (the newest when at the right end).");
  const lab::EvalPoint& p = d.evals[static_cast<size_t>(idx)];
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  // the image: test sample 0, 28 x 28
  const float px = std::max(2.0f, fs * 0.22f);
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  if (d.probe_pixels.size() >= 784) {
    for (int y = 0; y < 28; ++y)
      for (int x = 0; x < 28; ++x) {
        const int v = d.probe_pixels[static_cast<size_t>(y * 28 + x)];
        if (v == 0) continue;
        dl->AddRectFilled(ImVec2(p0.x + static_cast<float>(x) * px, p0.y + static_cast<float>(y) * px),
                          ImVec2(p0.x + static_cast<float>(x + 1) * px, p0.y + static_cast<float>(y + 1) * px),
                          IM_COL32(v, v, v, 255));
      }
  }
  dl->AddRect(p0, ImVec2(p0.x + 28 * px, p0.y + 28 * px), col::kGrid);
  ImGui::Dummy(ImVec2(28 * px, 28 * px));
  tooltip("Test sample 0 of Fashion-MNIST.");
  ImGui::SameLine();
  ImGui::BeginGroup();
  ImGui::Text("test sample 0: %s", p.probe_label >= 0 && p.probe_label < 10 ? kClasses[p.probe_label] : "?");
  auto argmax = [](const std::vector<float>& v) {
    return v.empty() ? -1 : static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
  };
  const int pe = argmax(p.probe_eval), pt = argmax(p.probe_train);
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kEval), "eval mode says %s (%.0f%%)", pe >= 0 ? kClasses[pe] : "?",
                     pe >= 0 ? 100.0 * p.probe_eval[static_cast<size_t>(pe)] : 0.0);
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kTrain), "train mode says %s (%.0f%%)",
                     pt >= 0 ? kClasses[pt] : "?", pt >= 0 ? 100.0 * p.probe_train[static_cast<size_t>(pt)] : 0.0);
  ImGui::TextDisabled("In train mode its output depends on the other %lld images of its batch.",
                      static_cast<long long>(std::max<int64_t>(0, d.cfg.batch_size - 1)));
  ImGui::EndGroup();
  // bars: probability per class, both modes
  const ImVec2 b0 = ImGui::GetCursorScreenPos();
  const float w = ImGui::GetContentRegionAvail().x;
  const float row = fs * 1.05f, label_w = fs * 5.5f;
  ImFont* small = font(FontId::Small);
  for (int k = 0; k < 10; ++k) {
    const float y = b0.y + row * static_cast<float>(k);
    dl->AddText(small, small->FontSize, ImVec2(b0.x, y), k == p.probe_label ? col::kText : col::kDim, kClasses[k]);
    const float bw = w - label_w - fs * 3;
    const float ve = k < static_cast<int>(p.probe_eval.size()) ? p.probe_eval[static_cast<size_t>(k)] : 0;
    const float vt = k < static_cast<int>(p.probe_train.size()) ? p.probe_train[static_cast<size_t>(k)] : 0;
    dl->AddRectFilled(ImVec2(b0.x + label_w, y + 1), ImVec2(b0.x + label_w + bw * ve, y + row * 0.45f), col::kEval);
    dl->AddRectFilled(ImVec2(b0.x + label_w, y + row * 0.48f), ImVec2(b0.x + label_w + bw * vt, y + row * 0.92f), col::kTrain);
    dl->AddText(small, small->FontSize, ImVec2(b0.x + label_w + bw + 4, y), col::kDim, fmt("%.2f", std::max(ve, vt)).c_str());
  }
  ImGui::Dummy(ImVec2(w, row * 10));
  tooltip("softmax outputs of the model for test sample 0: blue = eval mode, orange = train mode.");
}

void update_cache(const RunData& d, const BnViewState& bn, TrainEvalViewState::Cache& c) {
  if (c.layer != bn.layer || c.channel != bn.channel || c.built > d.by_step.size()) {
    c = TrainEvalViewState::Cache{};
    c.layer = bn.layer;
    c.channel = bn.channel;
  }
  for (size_t s = c.built; s < d.by_step.size(); ++s) {
    const lab::StepRecord* r = d.record(static_cast<int64_t>(s), 0);
    if (!r) break;  // rank 0 has not recorded this step yet
    c.built = s + 1;
    if (bn.layer >= static_cast<int>(r->bn.size())) continue;
    const lab::BnLayerRecord& b = r->bn[static_cast<size_t>(bn.layer)];
    if (bn.channel >= static_cast<int>(b.running_mean.size())) continue;
    c.x.push_back(static_cast<float>(s + 1));  // after s + 1 updates: a log axis needs x > 0
    c.running.push_back(b.running_mean[static_cast<size_t>(bn.channel)]);
    c.batch.push_back(b.batch_mean[static_cast<size_t>(bn.channel)]);
  }
}

void draw_convergence(const RunData& d, TrainEvalViewState& st, const BnViewState& bn, float height) {
  ChartOptions o;
  o.log_x = st.log_x;
  o.x_label = "updates";
  update_cache(d, bn, st.cache);
  const TrainEvalViewState::Cache& c = st.cache;
  heading("How the running statistics converge");
  ImGui::TextDisabled("rank 0, BatchNorm module %s, channel %d (choose them in the BatchNorm view)",
                      d.by_step.empty() || d.by_step[0].empty() || bn.layer >= static_cast<int>(d.by_step[0][0].bn.size())
                          ? "?"
                          : d.by_step[0][0].bn[static_cast<size_t>(bn.layer)].layer.c_str(),
                      bn.channel);
  std::vector<ChartSeries> s = {
      {"batch mean used", col::kTrain, c.x.data(), c.batch.data(), static_cast<int>(c.x.size()), 1.2f, true},
      {"running_mean", col::kEval, c.x.data(), c.running.data(), static_cast<int>(c.x.size()), 2.0f}};
  o.id = "te_conv";
  o.size = ImVec2(0, height);
  o.value_fmt = "%.5g";
  const double m = d.cfg.bn_momentum.value_or(0.1);
  const double k = static_cast<double>(c.x.size());
  o.hover_note = fmt("running_mean = (1 - m) x running_mean + m x batch mean, m = %.3g: after k = %.0f updates the "
                     "starting value 0 still weighs (1 - m)^k = %.3g.",
                     m, k, std::pow(1 - m, k));
  line_chart(o, s);
}

}  // namespace

void draw_train_eval_view(const RunData& d, TrainEvalViewState& st, BnViewState& bn) {
  const TrainEvalSeries t = train_eval_series(d);
  if (t.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped(
        "This view compares model.train() and model.eval() on the test set as training goes: train mode normalizes "
        "with each batch's own statistics, eval mode with the running statistics BatchNorm accumulated. Early on the "
        "running statistics lag behind and the modes disagree; the curves meet as they converge. It also shows one "
        "test image's outputs in both modes.");
    ImGui::PopStyleColor();
    ImGui::TextWrapped("%s", t.note.c_str());
    note_item("text", t.note);
    if (d.phase == RunPhase::Failed) text_wrapped_colored(col::kError, d.error);
    if (d.by_step.empty()) return;
  }
  const float fs = ImGui::GetFontSize();
  if (!d.evals.empty()) {
    const lab::EvalPoint& p = d.evals.back();
    labeled_value("newest", fmt("after %lld iterations: eval mode %.3f, train mode %.3f (gap %+.3f)",
                                static_cast<long long>(p.steps), p.eval_mode.acc, p.train_mode.acc,
                                p.eval_mode.acc - p.train_mode.acc),
                  "Test accuracy of a copy of rank 0's model on the first test samples. gap = eval - train mode.");
  } else if (!d.epochs.empty()) {
    const lab::EpochRecord& e = d.epochs.back();
    labeled_value("newest", fmt("end of epoch %lld, after %lld iterations: test accuracy %.3f, loss %.3f (eval mode)",
                                static_cast<long long>(e.epoch + 1), static_cast<long long>(e.steps), e.test_acc,
                                e.test_loss),
                  "Rank 0's model in eval mode (running statistics) on every test sample, where the epoch ended.");
  }
  ImGui::SameLine(0, ImGui::GetFontSize() * 2);
  ImGui::Checkbox("log scale", &st.log_x);
  tooltip("Iterations on a logarithmic axis: the first evaluations (after 1, 2, 4, 8, ... iterations) and updates, "
          "while the running statistics are still far from the data's, get as much room as the later ones. (The "
          "end-of-epoch points alone, without --eval-every, stay on a linear axis.)");
  if (ImGui::BeginTable("te", 2, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_Resizable)) {
    ImGui::TableSetupColumn("curves", ImGuiTableColumnFlags_WidthStretch, 1.4f);
    ImGui::TableSetupColumn("probe", ImGuiTableColumnFlags_WidthStretch, 1.0f);
    ImGui::TableNextColumn();
    const float note_h = t.note.empty() ? 0.0f : fs * 4.5f;  // about three wrapped lines
    const float h = std::max(fs * 6, (ImGui::GetContentRegionAvail().y - fs * 6.5f - note_h) / 2);
    draw_curves(d, t, st.log_x, h);
    if (!t.empty() && !t.note.empty()) {  // what the run has, and what it needs for more
      text_wrapped_colored(col::kText, t.note);
    }
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("Both modes use the same weights; only the BatchNorm statistics differ. Early on the running "
                       "statistics still carry their start (mean 0, variance 1) and eval mode trails; later eval "
                       "mode wins, the more so the smaller the batches whose statistics train mode uses (here %lld).",
                       static_cast<long long>(d.cfg.batch_size));
    ImGui::PopStyleColor();
    ImGui::TableNextColumn();
    draw_probe(d, st);
    ImGui::Spacing();
    draw_convergence(d, st, bn, std::max(fs * 6, ImGui::GetContentRegionAvail().y - fs * 2.5f));
    ImGui::EndTable();
  }
}

}  // namespace viz
