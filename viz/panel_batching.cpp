// View 3, batching and drop_last. One epoch of DistributedSampler + per-rank DataLoader as a grid:
// a row per iteration, in each row every rank's batch (cells coloured by rank, the dataset index
// written in when there is room). Padded positions (the sampler repeating the head of the list),
// samples the sampler's or the loader's drop_last removes, and each rank's short last batch are
// marked; the formulas above the grid give the same numbers. A configuration that runs into the
// BatchNorm batch-of-one failure says so here, and a run that failed with it shows the error.
// DataParallel (--mode dp) has no sampler: its one DataLoader's global batches, each cut over the
// devices by torch.chunk, in the same grid.
//
// Sections: 1. DistributedSampler: formulas, legend, grid  2. DataParallel: formulas, grid
// 3. the view
#include <algorithm>
#include <cmath>
#include <utility>

#include "data_parallel.h"
#include "draw.h"
#include "panels.h"

namespace viz {

namespace {

constexpr ImU32 kPadMark = IM_COL32(213, 94, 0, 255);   // vermillion: padding, the single sample

// The grid both layouts draw: a row per batch, `groups` groups of `per_group` cells (a rank's batch
// or a device's chunk), a label column on the left, the dataset index written in each cell when
// it fits.
struct IndexGrid {
  float label_w, gap, cell, row_h;
  int groups;
  int64_t per_group;
  bool numbers;
  ImFont* small;

  IndexGrid(int groups_, int64_t per_group_, int64_t dataset_size) : groups(groups_), per_group(per_group_) {
    const float fs = ImGui::GetFontSize();
    label_w = fs * 3.2f;
    gap = fs * 0.45f;
    const float avail = ImGui::GetContentRegionAvail().x - label_w - gap * static_cast<float>(groups) - fs;
    cell = std::clamp(avail / static_cast<float>(groups * per_group), 3.0f, fs * 2.6f);
    row_h = std::max(cell, fs * 1.3f) + 3;
    small = font(FontId::Small);
    const std::string widest = fmt("%lld", static_cast<long long>(std::max<int64_t>(dataset_size - 1, 1)));
    numbers = small->CalcTextSizeA(small->FontSize, FLT_MAX, 0, widest.c_str()).x + 2 <= cell;
  }
  float row_width() const { return label_w + static_cast<float>(groups) * (static_cast<float>(per_group) * cell + gap); }
  // Cell i of group g in the row that starts at p0: its corners a (top left) and c (bottom right).
  std::pair<ImVec2, ImVec2> cell_rect(ImVec2 p0, int g, int64_t i) const {
    const ImVec2 a(p0.x + label_w + static_cast<float>(g) * (static_cast<float>(per_group) * cell + gap) + static_cast<float>(i) * cell,
                   p0.y + 1);
    return {a, ImVec2(a.x + cell - 1, a.y + row_h - 3)};
  }
  void row_label(ImDrawList* dl, ImVec2 p0, bool current, const std::string& text) const {
    dl->AddText(small, small->FontSize, ImVec2(p0.x, p0.y + (row_h - small->FontSize) / 2), current ? col::kText : col::kDim,
                text.c_str());
  }
  // A filled cell; `fails` rings it as the sample BatchNorm cannot normalize alone.
  void filled(ImDrawList* dl, ImVec2 a, ImVec2 c, ImU32 fill, int64_t index, bool fails) const {
    dl->AddRectFilled(a, c, fill);
    if (fails) dl->AddRect(ImVec2(a.x - 2, a.y - 2), ImVec2(c.x + 2, c.y + 2), col::kError, 0, 0, 2.5f);
    if (!numbers) return;
    const std::string t = fmt("%lld", static_cast<long long>(index));
    const ImVec2 ts = small->CalcTextSizeA(small->FontSize, FLT_MAX, 0, t.c_str());
    dl->AddText(small, small->FontSize, ImVec2((a.x + c.x - ts.x) / 2, (a.y + c.y - ts.y) / 2), text_on(fill), t.c_str());
  }
  static bool hovered(ImVec2 a, ImVec2 c) {
    const ImVec2 m = ImGui::GetIO().MousePos;
    return m.x >= a.x && m.x < c.x && m.y >= a.y && m.y < c.y && ImGui::IsWindowHovered();
  }
  // Ends the row: the current one framed, the cursor moved below it.
  void end_row(ImDrawList* dl, ImVec2 p0, bool current) const {
    if (current) dl->AddRect(ImVec2(p0.x + label_w - 3, p0.y - 1), ImVec2(p0.x + row_width(), p0.y + row_h - 1), col::kText, 0, 0, 1.5f);
    ImGui::Dummy(ImVec2(row_width(), row_h));
  }
};

// The epoch's layout in `slot`, made again only when its key (the settings it depends on) changes;
// nullptr, with the error drawn, when the settings cannot be laid out.
template <class Layout, class Make>
const Layout* cached_layout(BatchingViewState& st, const std::string& key, Layout& slot, Make&& make) {
  if (key != st.layout_key) {
    st.layout_key = key;
    st.layout_error.clear();
    try {
      slot = make();
    } catch (const std::exception& e) {
      st.layout_error = e.what();
    }
  }
  if (!st.layout_error.empty()) {
    text_wrapped_colored(col::kError, st.layout_error);
    return nullptr;
  }
  return &slot;
}

// ---- 1. DistributedSampler + per-rank DataLoader ----

std::string layout_key(const lab::RunConfig& c, int64_t L, int64_t epoch) {
  return fmt("%lld/%d/%lld/%d/%llu/%d/%d/%lld", static_cast<long long>(L), c.world_size, static_cast<long long>(c.batch_size),
             c.shuffle, static_cast<unsigned long long>(c.seed), c.sampler_drop_last, c.drop_last, static_cast<long long>(epoch));
}

void draw_formulas(const EpochLayout& l) {
  const long long L = l.dataset_size, R = l.world, B = l.batch_size, n = l.num_samples;
  if (l.sampler_drop_last)
    labeled_value("samples per rank", fmt("%lld", n),
                  fmt("DistributedSampler(drop_last=True): num_samples = ceil((L - R) / R) = ceil((%lld - %lld) / %lld) "
                      "= %lld when L is not a multiple of R, else L / R",
                      L, R, R, n));
  else
    labeled_value("samples per rank", fmt("ceil(L / R) = ceil(%lld / %lld) = %lld", L, R, n),
                  "DistributedSampler(drop_last=False): every rank gets ceil(L / R) samples; the list is padded to "
                  "R x that by repeating its head.");
  ImGui::SameLine(0, ImGui::GetFontSize() * 2);
  if (l.padding > 0)
    labeled_value("padding", fmt("%lld x %lld - %lld = %lld repeated", n, R, L, static_cast<long long>(l.padding)),
                  fmt("total_size = num_samples x R = %lld; the last %lld position(s) repeat the first sample(s) of the "
                      "(shuffled) list, so those samples are seen twice this epoch.",
                      n * R, static_cast<long long>(l.padding)));
  else if (!l.cut_tail.empty())
    labeled_value("cut", fmt("%zu sample(s)", l.cut_tail.size()),
                  fmt("drop_last=True: the last L - total_size = %lld - %lld sample(s) of the shuffled list are not used "
                      "this epoch.",
                      L, static_cast<long long>(l.total_size)));
  else
    labeled_value("padding", "none", fmt("L = %lld is a multiple of R = %lld.", L, R));
  if (l.loader_drop_last)
    labeled_value("iterations per epoch", fmt("floor(%lld / %lld) = %lld", n, B, static_cast<long long>(l.steps)),
                  "DataLoader(drop_last=True): floor(samples per rank / batch_size) full batches; the rest is dropped.");
  else
    labeled_value("iterations per epoch", fmt("ceil(%lld / %lld) = %lld", n, B, static_cast<long long>(l.steps)),
                  "DataLoader(drop_last=False): ceil(samples per rank / batch_size) batches, the last one possibly "
                  "shorter.");
  ImGui::SameLine(0, ImGui::GetFontSize() * 2);
  labeled_value("last batch", fmt("%lld per rank", static_cast<long long>(l.last_batch)),
                fmt("The last batch of every rank holds %lld - (%lld - 1) x %lld = %lld sample(s)%s. Global samples in "
                    "that iteration: R x %lld = %lld instead of %lld.",
                    n, static_cast<long long>(l.steps), B, static_cast<long long>(l.last_batch),
                    l.loader_dropped ? fmt(" (the loader drops %lld more)", static_cast<long long>(l.loader_dropped)).c_str() : "",
                    static_cast<long long>(l.last_batch), R * l.last_batch, R * B));
  if (l.loader_dropped > 0) {
    ImGui::SameLine(0, ImGui::GetFontSize() * 2);
    labeled_value("dropped by the loader", fmt("%lld per rank", static_cast<long long>(l.loader_dropped)),
                  fmt("n mod B = %lld mod %lld = %lld sample(s) of every rank are not trained on this epoch.", n, B,
                      static_cast<long long>(l.loader_dropped)));
  }
}

// One legend entry: a square swatch (filled, or framed `frame` px wide) and its label.
void swatch(ImU32 color, float frame, const std::string& label) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  const ImVec2 p = ImGui::GetCursorScreenPos();
  if (frame > 0) dl->AddRect(ImVec2(p.x, p.y + 2), ImVec2(p.x + fs * 0.8f, p.y + fs - 1), color, 0, 0, frame);
  else dl->AddRectFilled(ImVec2(p.x, p.y + 3), ImVec2(p.x + fs * 0.8f, p.y + fs - 1), color);
  ImGui::Dummy(ImVec2(fs * 0.9f, fs));
  ImGui::SameLine();
  ImGui::TextUnformatted(label.c_str());
  ImGui::SameLine();
}

// The grid's legend: a colour per rank (or device), the padding frame where there is padding,
// empty cells and faded (dropped) ones.
void legend(int members, const char* member, bool padding, const char* empty) {
  for (int r = 0; r < members; ++r) swatch(rank_color(r), 0, fmt("%s %d", member, r));
  if (padding) swatch(kPadMark, 2.5f, "padding (a repeat; thin frame: its original)");
  swatch(col::kFaint, 1.0f, empty);
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kDim), "faded: dropped");
}

// The grid: one row per iteration, only the visible rows are drawn (ImGuiListClipper).
void draw_grid(const RunData& d, const EpochLayout& l, int64_t current_step_in_epoch, bool one_problem, bool by_rank) {
  const int64_t rows = l.steps + (l.loader_dropped > 0 ? 1 : 0);
  const int R = l.world;
  const int64_t B = l.batch_size;
  const IndexGrid grid(R, B, l.dataset_size);
  ImGui::BeginChild("batching_grid", ImVec2(0, 0), false);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImGuiListClipper clip;
  clip.Begin(static_cast<int>(rows), grid.row_h);
  while (clip.Step()) {
    for (int b = clip.DisplayStart; b < clip.DisplayEnd; ++b) {
      const ImVec2 p0 = ImGui::GetCursorScreenPos();
      const bool dropped_row = b >= l.steps;
      const bool cur = b == current_step_in_epoch;
      grid.row_label(dl, p0, cur, dropped_row ? "dropped" : fmt("it %d", b));
      const int64_t len = dropped_row ? l.loader_dropped : l.batch_len(b);
      for (int r = 0; r < R; ++r) {
        for (int64_t j = 0; j < B; ++j) {
          const auto [a, c] = grid.cell_rect(p0, r, j);
          // by rank: rank r's j-th sample of batch b; global order: the row's positions in order
          const int64_t pos = by_rank ? l.position(r, b, j) : (static_cast<int64_t>(b) * R * B + static_cast<int64_t>(r) * B + j);
          const bool empty = by_rank ? j >= len : pos >= std::min(l.total_size, (static_cast<int64_t>(b) * B + len) * R);
          if (empty || pos >= l.total_size) {
            dl->AddRect(a, c, col::kFaint);
            continue;
          }
          const int owner = l.rank_of(pos);
          const bool pad = l.is_padding(pos);
          const ImU32 fill = rank_color(owner, dropped_row ? 0.25f : 1.0f);
          grid.filled(dl, a, c, fill, l.global[static_cast<size_t>(pos)], one_problem && !dropped_row && len == 1 && b == l.steps - 1);
          if (pad) dl->AddRect(a, c, kPadMark, 0, 0, std::max(1.5f, grid.cell * 0.12f));
          // the original of a padded sample: seen again at the end of the epoch
          if (l.padding > 0 && l.dataset_size > 0 && pos < std::min(l.padding, l.dataset_size))
            dl->AddRect(ImVec2(a.x + 1, a.y + 1), ImVec2(c.x - 1, c.y - 1), kPadMark, 0, 0, 1.0f);
          if (IndexGrid::hovered(a, c)) {
            ImGui::BeginTooltip();
            ImGui::Text("dataset index %lld", static_cast<long long>(l.global[static_cast<size_t>(pos)]));
            ImGui::Text("position %lld of the %s list -> rank %lld mod %d = %d, its sample %lld", static_cast<long long>(pos),
                        l.padding ? "padded" : "global", static_cast<long long>(pos), R, owner,
                        static_cast<long long>(l.sample_of(pos)));
            ImGui::Text("batch %lld, slot %lld%s", static_cast<long long>(l.batch_of(pos)),
                        static_cast<long long>(l.sample_of(pos) % B), dropped_row ? " (dropped by the loader)" : "");
            if (pad)
              ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kPadMark),
                                 "padding: a repeat of position %lld (the head of the list)",
                                 static_cast<long long>((pos - l.dataset_size) % std::max<int64_t>(1, l.dataset_size)));
            ImGui::EndTooltip();
          }
        }
      }
      grid.end_row(dl, p0, cur);
    }
  }
  clip.End();
  if (!l.cut_tail.empty()) {
    ImGui::TextDisabled("cut by DistributedSampler(drop_last=True), not used this epoch:");
    std::string s;
    for (size_t i = 0; i < l.cut_tail.size() && i < 64; ++i) s += fmt("%lld ", static_cast<long long>(l.cut_tail[i]));
    if (l.cut_tail.size() > 64) s += "...";
    ImGui::TextWrapped("%s", s.c_str());
  }
  (void)d;
  ImGui::EndChild();
}

// ---- 2. DataParallel: one DataLoader, torch.chunk over the devices ----

void draw_dp_formulas(const DpEpochLayout& l) {
  const long long L = l.dataset_size, B = l.batch_size, k = l.devices;
  const long long steps = static_cast<long long>(l.batches.size());
  labeled_value("iterations per epoch", fmt("%s(L / B) = %s(%lld / %lld) = %lld", l.drop_last ? "floor" : "ceil",
                                             l.drop_last ? "floor" : "ceil", L, B, steps),
                l.drop_last ? "DataLoader(drop_last=True): full global batches only; the rest is dropped."
                            : "DataLoader(drop_last=False): the last global batch may be shorter.");
  ImGui::SameLine(0, ImGui::GetFontSize() * 2);
  labeled_value("chunk", fmt("ceil(B / devices) = ceil(%lld / %lld) = %lld", B, k, static_cast<long long>(l.chunk_size())),
                "torch.chunk(batch, devices): chunks of ceil(B / devices) samples, the last one the rest; when B is "
                "small there are fewer chunks than devices and the last devices idle.");
  const long long last = steps > 0 ? static_cast<long long>(l.batches.back().size()) : 0;
  std::string sizes;
  for (int64_t n : l.chunks(steps - 1)) sizes += fmt("%s%lld", sizes.empty() ? "" : ", ", static_cast<long long>(n));
  ImGui::SameLine(0, ImGui::GetFontSize() * 2);
  labeled_value("last batch", fmt("%lld: %s", last, sizes.c_str()),
                fmt("The last global batch of the epoch holds %lld samples (L mod B = %lld mod %lld = %lld%s), chunked "
                    "over the devices as %s.",
                    last, L, B, L % B, l.drop_last && !l.dropped.empty() ? ", dropped by drop_last" : "", sizes.c_str()));
}

void draw_dp_grid(const DpEpochLayout& l, int64_t current, bool one_fails) {
  const int64_t rows = static_cast<int64_t>(l.batches.size()) + (l.dropped.empty() ? 0 : 1);
  const int k = l.devices;
  const IndexGrid grid(k, std::max<int64_t>(1, l.chunk_size()), l.dataset_size);
  ImGui::BeginChild("batching_grid", ImVec2(0, 0), false);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImGuiListClipper clip;
  clip.Begin(static_cast<int>(rows), grid.row_h);
  while (clip.Step()) {
    for (int b = clip.DisplayStart; b < clip.DisplayEnd; ++b) {
      const ImVec2 p0 = ImGui::GetCursorScreenPos();
      const bool dropped_row = b >= static_cast<int64_t>(l.batches.size());
      const std::vector<int64_t>& batch = dropped_row ? l.dropped : l.batches[static_cast<size_t>(b)];
      const std::vector<int64_t> chunks = lab::torch_chunk_sizes(static_cast<int64_t>(batch.size()), k);
      grid.row_label(dl, p0, b == current, dropped_row ? "dropped" : fmt("it %d", b));
      int64_t offset = 0;
      for (int j = 0; j < k; ++j) {
        const int64_t len = j < static_cast<int>(chunks.size()) ? chunks[static_cast<size_t>(j)] : 0;
        for (int64_t i = 0; i < grid.per_group; ++i) {
          const auto [a, c] = grid.cell_rect(p0, j, i);
          if (i >= len) {
            dl->AddRect(a, c, col::kFaint);
            continue;
          }
          const int64_t index = batch[static_cast<size_t>(offset + i)];
          grid.filled(dl, a, c, rank_color(j, dropped_row ? 0.25f : 1.0f), index, one_fails && len == 1 && !dropped_row);
          if (IndexGrid::hovered(a, c)) {
            ImGui::BeginTooltip();
            ImGui::Text("dataset index %lld", static_cast<long long>(index));
            ImGui::Text("global batch %d, sample %lld -> device %d's chunk (%lld samples), its sample %lld", b,
                        static_cast<long long>(offset + i), j, static_cast<long long>(len), static_cast<long long>(i));
            if (dropped_row) ImGui::TextDisabled("dropped by the loader's drop_last");
            ImGui::EndTooltip();
          }
        }
        offset += len;
      }
      grid.end_row(dl, p0, b == current);
    }
  }
  clip.End();
  ImGui::EndChild();
}

void draw_dp_batching(const RunData& d, BatchingViewState& st, int64_t L, int64_t epoch, int64_t current) {
  const lab::RunConfig& c = d.cfg;
  const DpEpochLayout* lp = cached_layout(st, "dp/" + layout_key(c, L, epoch), st.dp_layout,
                                         [&] { return layout_dp_epoch(c, L, epoch); });
  if (!lp) return;
  const DpEpochLayout& l = *lp;
  ImGui::SameLine();
  ImGui::TextDisabled("epoch %lld: L = %lld samples, B = %lld per iteration (global), %d devices%s",
                      static_cast<long long>(epoch), static_cast<long long>(L), static_cast<long long>(l.batch_size),
                      l.devices, c.shuffle ? fmt(", shuffled (seed %llu)", static_cast<unsigned long long>(c.seed)).c_str()
                                           : ", in order (shuffle off)");
  draw_dp_formulas(l);
  // the batch-of-one BatchNorm failure: a chunk of one sample (the mlp's BatchNorm1d)
  bool one = false;
  for (int64_t b = 0; b < static_cast<int64_t>(l.batches.size()) && c.model == "mlp"; ++b)
    for (int64_t n : l.chunks(b)) one = one || n == 1;
  const bool failed_one = d.phase == RunPhase::Failed && d.error.find("Expected more than 1 value per channel") != std::string::npos;
  if (failed_one) {
    text_wrapped_colored(col::kError, "TrainingError: " + d.error);
    if (!d.error_hint.empty()) text_wrapped_colored(col::kWarn, "why: " + d.error_hint);
  } else if (one) {
    text_wrapped_colored(col::kWarn, "warning: a device's chunk holds 1 sample (red frame): BatchNorm in training mode "
                                     "fails there with \"Expected more than 1 value per channel when training\"");
  }
  legend(l.devices, "device", false, "no sample (short chunk, idle device)");
  ImGui::NewLine();
  ImGui::TextWrapped("DataParallel has one DataLoader and no DistributedSampler: every iteration takes the next %lld "
                     "samples of the epoch's order, and torch.chunk cuts them into %d chunk(s) of up to %lld, one per "
                     "device. %s",
                     static_cast<long long>(l.batch_size), static_cast<int>(l.chunks(0).size()),
                     static_cast<long long>(l.chunk_size()),
                     static_cast<int>(l.chunks(0).size()) < l.devices ? "The batch is too small for every device: the last ones idle."
                                                                       : "Nothing is padded and nothing is seen twice.");
  draw_dp_grid(l, current, one || failed_one);
}

}  // namespace

// ---- 3. the view ----

void draw_batching_view(const RunData& d, BatchingViewState& st) {
  const lab::RunConfig& c = d.cfg;
  const int64_t L = d.train_size > 0 ? d.train_size : train_samples(c, kFashionTrainSize);
  // the epoch the run is in, and the iteration within it
  int64_t run_epoch = 0, in_epoch = -1;
  const int64_t last = d.steps_done() - 1;
  if (const lab::StepRecord* r = d.record(last, 0)) {
    run_epoch = r->epoch;
    in_epoch = r->batch;
  }
  ImGui::Checkbox("epoch of the run", &st.follow);
  tooltip(std::string(d.live ? "Show the epoch the run is in and highlight its newest iteration"
                             : "Show the epoch the run ended in") +
          "; off: choose an epoch. With shuffle, every epoch has its own order (the sampler's seed is seed + epoch).");
  if (!st.follow) {
    ImGui::SameLine();
    int e = static_cast<int>(st.epoch);
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 6);
    if (ImGui::InputInt("epoch", &e)) st.epoch = std::max(0, e);
  }
  const bool global_batches = d.caps().global_batch;
  if (!global_batches) {  // DataParallel's chunks are slices of the global batch already
    ImGui::SameLine();
    ImGui::Checkbox("group by rank", &st.by_rank);
    tooltip("On: each row shows rank 0's batch, then rank 1's, ... Off: the positions of the global list in order "
            "(rank = position mod world_size: the sampler deals them out like cards).");
  }
  const int64_t epoch = st.follow ? run_epoch : st.epoch;
  if (global_batches) {
    draw_dp_batching(d, st, L, epoch, st.follow && d.live ? in_epoch : -1);
    return;
  }
  const EpochLayout* lp = cached_layout(st, layout_key(c, L, epoch), st.layout, [&] { return layout_epoch(c, L, epoch); });
  if (!lp) return;
  const EpochLayout& l = *lp;
  ImGui::SameLine();
  ImGui::TextDisabled("epoch %lld: L = %lld samples, R = %d ranks, B = %lld per rank%s", static_cast<long long>(epoch),
                      static_cast<long long>(L), l.world, static_cast<long long>(l.batch_size),
                      c.shuffle ? fmt(", shuffled with seed %llu + %lld", static_cast<unsigned long long>(c.seed),
                                      static_cast<long long>(epoch)).c_str()
                                : ", in order (shuffle off)");
  draw_formulas(l);

  // the batch-of-one BatchNorm failure: predicted, and as it happened
  const std::string problem = batch_of_one_problem(l, c);
  const bool failed_one = d.phase == RunPhase::Failed && d.error.find("Expected more than 1 value per channel") != std::string::npos;
  if (failed_one) {
    text_wrapped_colored(col::kError, "TrainingError: " + d.error);
    if (!d.error_hint.empty()) text_wrapped_colored(col::kWarn, "why: " + d.error_hint);
  } else if (!problem.empty()) {
    text_wrapped_colored(col::kWarn, "warning: " + problem);
  }
  legend(l.world, "rank", true, "no sample (short batch)");
  ImGui::NewLine();
  // the point of the picture, in words
  std::string words = fmt("Each of the %d ranks runs %lld iterations this epoch", l.world, static_cast<long long>(l.steps));
  if (l.last_batch < l.batch_size && l.steps > 0)
    words += fmt("; the last one is short: %lld sample(s) per rank, %lld in all instead of %lld",
                 static_cast<long long>(l.last_batch), static_cast<long long>(l.last_batch) * l.world,
                 static_cast<long long>(l.batch_size) * l.world);
  words += ".";
  if (l.padding > 0) {
    std::string idx;
    for (int64_t p = l.dataset_size; p < l.total_size && p < l.dataset_size + 8; ++p)
      idx += fmt("%s%lld", idx.empty() ? "" : ", ", static_cast<long long>(l.global[static_cast<size_t>(p)]));
    words += fmt(" The sampler padded %lld position(s) with dataset index(es) %s (the head of this epoch's order), so "
                 "that every rank gets %lld: those samples are trained on twice.",
                 static_cast<long long>(l.padding), idx.c_str(), static_cast<long long>(l.num_samples));
  }
  if (l.loader_dropped > 0)
    words += fmt(" The loader's drop_last drops each rank's last %lld sample(s) (faded row).", static_cast<long long>(l.loader_dropped));
  ImGui::TextWrapped("%s", words.c_str());
  const int64_t cur = st.follow && d.live ? in_epoch : -1;
  draw_grid(d, l, cur, !problem.empty() || failed_one, st.by_rank);
}

}  // namespace viz
