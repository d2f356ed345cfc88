// View 1, allreduce traffic. Ranks sit on a circle; every transfer the Chunk events record is an
// arrow from src to dst, and the chunk travels along it during its step. A table shows what each
// rank's buffer holds (a stripe per rank whose data is summed in), which chunk each rank owns
// after reduce-scatter, the bytes per link, and the algorithm's rule with the live numbers: the
// ring's 2(N-1)/N, naive's everything through rank 0, the tree's halving and doubling. With
// DataParallel there is no allreduce: the view shows its reduce of every device's gradients into
// device 0 (and, asked for, its scatters, replicates and gathers).
//
// What is shown: while the run is paused or in slow motion, the newest collective as it happens;
// at full speed, the newest finished one replayed at a readable pace; or any step chosen with the
// slider.
//
// Sections: 1. choosing the collective and the step  2. the ring  3. the side panel (phase words,
// the algorithm's rule, buffers)  4. the view
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "draw.h"
#include "panels.h"
#include "tree_allreduce.h"  // kTreeDoublingBytes

namespace viz {

namespace {

constexpr double kReplayStepSeconds = 0.7;  // per step when replaying a finished collective
constexpr double kReplayHoldSeconds = 1.5;  // on the final state before the next one
constexpr float kPi = 3.14159265f;

// The "show" choices of a parallelism mode: what synchronizes training first.
std::vector<const char*> filter_names(const lab::ModeCaps& caps) {
  if (caps.master_device) return {"gradient reduce", "every transfer"};
  return {caps.averages_parameters ? "gradients and averages" : "gradient buckets", "every allreduce", "every collective"};
}

CollectiveFilter filter_of(int i, const lab::RunConfig& c) {
  CollectiveFilter f = training_sync_filter(c);
  const int n = static_cast<int>(filter_names(lab::mode_of(c).caps()).size());
  i = std::clamp(i, 0, n - 1);
  if (i == n - 1 && i > 0) {
    f.op.clear();
    f.what.clear();
  } else if (i == 1) {
    f.what.clear();
  }
  return f;
}

// The phases the shown collective will have, in order (an allreduce: as its algorithm runs; else
// the phases seen so far).
std::vector<PhaseSteps> expected_phases(const CollectiveTrace& t) {
  if (t.op == "allreduce" && !t.algorithm.empty()) {
    std::vector<PhaseSteps> p = allreduce_phases(t.algorithm, t.world, t.bytes);
    int total = 0;
    for (const PhaseSteps& x : p) total += x.steps;
    if (total >= t.steps) return p;
  }
  if ((t.op == "reduce_scatter" || t.op == "allgather") && !t.algorithm.empty()) {
    // the algorithm's phases, unless the transfers show others (SyncBatchNorm's allgather is
    // always the ring's, whatever --allreduce says)
    const std::vector<PhaseSteps> p = collective_phases(t.op, t.algorithm, t.world, t.bytes);
    bool fits = true;
    for (const Transfer& x : t.transfers)
      fits = fits && std::any_of(p.begin(), p.end(), [&](const PhaseSteps& s) { return s.phase == x.phase; });
    int total = 0;
    for (const PhaseSteps& x : p) total += x.steps;
    if (fits && total >= t.steps) return p;
  }
  std::vector<PhaseSteps> seen;
  for (const Transfer& x : t.transfers) {
    if (seen.empty() || seen.back().phase != x.phase) seen.push_back({x.phase, 0});
    seen.back().steps = std::max(seen.back().steps, x.ring_step + 1);
  }
  return seen;
}

// Total global steps the shown collective will have (a ring allreduce: 2(N - 1)).
int expected_steps(const CollectiveTrace& t) {
  int total = 0;
  for (const PhaseSteps& x : expected_phases(t)) total += x.steps;
  return std::max(total, t.steps);
}

// Combining phases are blue in the strip of steps, copying ones green.
bool combining(lab::Phase p) {
  return p == lab::Phase::ReduceScatter || p == lab::Phase::Gather || p == lab::Phase::Reduce;
}

// The algorithm in words, for the view's headings.
std::string algorithm_title(const RunData& d) {
  if (d.caps().master_device) return "DataParallel: no allreduce, everything through device 0";
  if (d.cfg.allreduce == "naive") return "naive allreduce: everything through rank 0";
  if (d.cfg.allreduce == "tree") return "tree allreduce: recursive halving-doubling";
  if (d.cfg.allreduce == "mpi") return "MPI's own allreduce (its steps are not visible)";
  return "ring allreduce";
}

// ---- 1. which collective, which step ----

struct Shown {
  bool valid = false;
  int steps_done = 0;    // transfers of global steps < steps_done have happened
  int anim_step = -1;    // the step whose chunks are drawn in flight (-1: none)
  float progress = 1.0f; // 0..1 along the arrows
  bool live = false;
  // Steps whose effect the buffers and byte counts show: the step in flight counts once its
  // chunks have arrived.
  int settled() const { return anim_step >= 0 && progress < 1.0f ? anim_step : steps_done; }
};

Shown choose(const RunData& d, RingViewState& st, const FrameClock& clock) {
  Shown s;
  const CollectiveFilter f = filter_of(st.filter, d.cfg);
  const bool live_now = d.live && (d.phase == RunPhase::Paused || d.gate_delay_s >= 0.05);
  if (st.follow) {
    uint64_t seq = 0;
    if (live_now) {
      if (latest_collective(d.events, f, false, seq)) {
        if (!st.have_shown || seq != st.shown_seq) st.anim_step = -1;
        st.shown_seq = seq;
        st.have_shown = true;
      }
    } else {
      const double elapsed = clock.now - st.replay_t0;
      const int total = st.have_shown ? expected_steps(st.trace) : 0;
      const bool replay_over = elapsed > total * kReplayStepSeconds + kReplayHoldSeconds;
      // screenshots (frozen clock) always show the newest finished collective
      if ((!st.have_shown || replay_over || clock.frozen || st.trace_seq != st.shown_seq) &&
          latest_collective(d.events, f, true, seq)) {
        if (!st.have_shown || seq != st.shown_seq) st.replay_t0 = clock.now;
        else if (replay_over) st.replay_t0 = clock.now;
        st.shown_seq = seq;
        st.have_shown = true;
      }
    }
  }
  if (!st.follow && !st.have_shown && st.want_iteration >= 0) {
    uint64_t seq = 0;
    if (collective_of_iteration(d.events, f, st.want_iteration, seq)) {
      st.shown_seq = seq;
      st.have_shown = true;
    }
  }
  if (!st.have_shown) return s;
  if (st.trace_seq != st.shown_seq || (st.trace_version != d.events_version && !st.trace.complete())) {
    st.trace = collect_trace(d.events, st.shown_seq, d.cfg.allreduce);
    st.trace_seq = st.shown_seq;
    st.trace_version = d.events_version;
  }
  const CollectiveTrace& t = st.trace;
  if (t.transfers.empty() && t.world <= 1) return s;
  s.valid = true;
  int recorded = 0;
  for (const Transfer& x : t.transfers) recorded = std::max(recorded, x.global_step + 1);
  if (!st.follow) {
    s.steps_done = std::clamp(st.scrub_step, 0, std::max(recorded, 0));
    s.anim_step = -1;
    return s;
  }
  if (live_now) {
    s.live = true;
    s.steps_done = recorded;
    if (recorded > 0 && st.anim_step != recorded - 1) {
      st.anim_step = recorded - 1;
      st.anim_t0 = clock.now;
    }
    const double dur = std::clamp(d.gate_delay_s * 0.9, 0.25, 0.6);
    s.anim_step = recorded - 1;
    s.progress = clock.frozen ? 0.55f : static_cast<float>(std::min(1.0, (clock.now - st.anim_t0) / dur));
    return s;
  }
  // replay
  const double tt = clock.frozen ? (recorded - 0.45) * kReplayStepSeconds : clock.now - st.replay_t0;
  const double stepf = tt / kReplayStepSeconds;
  const int k = static_cast<int>(std::floor(stepf));
  if (k >= recorded) {
    s.steps_done = recorded;
    s.anim_step = -1;
  } else {
    s.anim_step = std::max(0, k);
    s.steps_done = s.anim_step + 1;
    s.progress = static_cast<float>(std::clamp(stepf - k, 0.0, 1.0));
  }
  return s;
}

// ---- 2. the ring ----

ImVec2 bezier(const ImVec2& a, const ImVec2& c, const ImVec2& b, float t) {
  const float u = 1 - t;
  return ImVec2(u * u * a.x + 2 * u * t * c.x + t * t * b.x, u * u * a.y + 2 * u * t * c.y + t * t * b.y);
}

// A chunk box: one vertical stripe per rank whose data it holds (grey: not yet).
void chunk_box(ImDrawList* dl, ImVec2 p0, ImVec2 p1, uint64_t contrib, int world, bool outline, ImU32 outline_col) {
  dl->AddRectFilled(p0, p1, IM_COL32(55, 55, 60, 255));
  const int n = std::max(1, std::min(world, 64));
  const float w = (p1.x - p0.x) / static_cast<float>(n);
  for (int r = 0; r < n; ++r)
    if (contrib & (uint64_t{1} << r))
      dl->AddRectFilled(ImVec2(p0.x + w * static_cast<float>(r), p0.y), ImVec2(p0.x + w * static_cast<float>(r + 1), p1.y),
                        rank_color(r));
  dl->AddRect(p0, p1, outline ? outline_col : IM_COL32(20, 20, 20, 255), 0, 0, outline ? 2.5f : 1.0f);
}

void draw_ring(const RunData& d, const RingViewState& st, const Shown& sh, ImVec2 origin, float size) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const CollectiveTrace& t = st.trace;
  const int n = std::max(1, t.world > 0 ? t.world : d.world());
  const ImVec2 center(origin.x + size / 2, origin.y + size / 2);
  // room around the circle for the "owns cK" labels beside the nodes
  ImFont* label_font = font(FontId::Small);
  const float label_w = label_font->CalcTextSizeA(label_font->FontSize, FLT_MAX, 0, "owns c00").x;
  const float radius = std::max(size * 0.2f, std::min(size * 0.36f, size / 2 - ImGui::GetFontSize() * 1.7f - label_w - 8));
  const float node_r = std::clamp(radius * 0.55f * std::sin(kPi / static_cast<float>(std::max(n, 3))), 12.0f,
                                  ImGui::GetFontSize() * 1.7f);
  std::vector<ImVec2> pos(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const float a = -kPi / 2 + 2 * kPi * static_cast<float>(r) / static_cast<float>(n);
    pos[static_cast<size_t>(r)] = ImVec2(center.x + radius * std::cos(a), center.y + radius * std::sin(a));
  }
  // The arc of a link: bowed to its right, so a -> b and b -> a do not overlap.
  auto link_ctrl = [&](int a, int b) {
    const ImVec2 pa = pos[static_cast<size_t>(a)], pb = pos[static_cast<size_t>(b)];
    const ImVec2 mid((pa.x + pb.x) / 2, (pa.y + pb.y) / 2);
    const float dx = pb.x - pa.x, dy = pb.y - pa.y;
    const float len = std::sqrt(dx * dx + dy * dy) + 1e-3f;
    // ranks go clockwise, so the left of a -> b points away from the centre: the ring bulges out
    const float bow = n == 2 ? 0.3f : 0.16f;
    return ImVec2(mid.x + dy / len * len * bow, mid.y - dx / len * len * bow);
  };
  auto trim = [&](ImVec2 from, ImVec2 to, float by) {  // a point `by` before `to` on the way from `from`
    const float dx = to.x - from.x, dy = to.y - from.y;
    const float len = std::sqrt(dx * dx + dy * dy) + 1e-3f;
    return ImVec2(to.x - dx / len * by, to.y - dy / len * by);
  };

  // links: every src -> dst of this collective, with the bytes sent on it so far
  const float box = std::clamp(node_r * 1.1f, 14.0f, 40.0f), chunk_h = box * 0.7f;
  const std::vector<LinkBytes> all_links = link_bytes(t, 1 << 30);
  const std::vector<LinkBytes> done_links = link_bytes(t, sh.settled());
  ImFont* small = font(FontId::Small);
  for (const LinkBytes& l : all_links) {
    if (l.src < 0 || l.dst < 0 || l.src >= n || l.dst >= n) continue;
    const ImVec2 a = pos[static_cast<size_t>(l.src)], b = pos[static_cast<size_t>(l.dst)];
    const ImVec2 c = link_ctrl(l.src, l.dst);
    const ImVec2 b2 = trim(c, b, node_r + 3), s2 = trim(c, a, node_r + 2);
    dl->AddBezierQuadratic(s2, c, b2, IM_COL32(110, 110, 120, 200), 1.5f);
    // arrow head
    const ImVec2 tip = b2, back = bezier(s2, c, b2, 0.92f);
    const float dx = tip.x - back.x, dy = tip.y - back.y, len = std::sqrt(dx * dx + dy * dy) + 1e-3f;
    const float hs = std::max(6.0f, node_r * 0.35f);
    const ImVec2 u(dx / len, dy / len);
    dl->AddTriangleFilled(tip, ImVec2(tip.x - u.x * hs - u.y * hs * 0.5f, tip.y - u.y * hs + u.x * hs * 0.5f),
                          ImVec2(tip.x - u.x * hs + u.y * hs * 0.5f, tip.y - u.y * hs - u.x * hs * 0.5f),
                          IM_COL32(110, 110, 120, 220));
    uint64_t sent = 0;
    for (const LinkBytes& dlk : done_links)
      if (dlk.src == l.src && dlk.dst == l.dst) sent = dlk.bytes;
    const std::string label = fmt_bytes(static_cast<double>(sent));
    const ImVec2 m = bezier(s2, c, b2, 0.5f);
    const ImVec2 ts = small->CalcTextSizeA(small->FontSize, FLT_MAX, 0, label.c_str());
    // outside the curve's middle, clear of the chunk that travels along it
    const float ox = m.x - center.x, oy = m.y - center.y, ol = std::sqrt(ox * ox + oy * oy) + 1e-3f;
    const float off = chunk_h * 0.5f + 6 + std::fabs(ox / ol) * ts.x * 0.5f + std::fabs(oy / ol) * ts.y * 0.5f;
    const ImVec2 lp(m.x + ox / ol * off - ts.x / 2, m.y + oy / ol * off - ts.y / 2);
    dl->AddText(small, small->FontSize, lp, sent ? col::kText : col::kDim, label.c_str());
  }

  // chunks in flight during the animated step
  const BufferState before = buffer_state(t, std::max(0, sh.anim_step));
  if (sh.anim_step >= 0) {
    for (const Transfer& x : t.transfers) {
      if (x.global_step != sh.anim_step || x.src >= n || x.dst >= n || x.src < 0 || x.dst < 0) continue;
      const ImVec2 a = pos[static_cast<size_t>(x.src)], b = pos[static_cast<size_t>(x.dst)];
      const ImVec2 c = link_ctrl(x.src, x.dst);
      const ImVec2 s2 = trim(c, a, node_r + 2), b2 = trim(c, b, node_r + 3);
      dl->AddBezierQuadratic(s2, c, b2, rank_color(x.src, 0.9f), 3.0f);
      const ImVec2 p = bezier(s2, c, b2, std::clamp(sh.progress, 0.0f, 1.0f));
      const uint64_t v = x.chunk >= 0 && x.chunk < before.chunks ? before.at(x.src, x.chunk) : 0;
      chunk_box(dl, ImVec2(p.x - box / 2, p.y - box * 0.35f), ImVec2(p.x + box / 2, p.y + box * 0.35f), v, n, true,
                IM_COL32(255, 255, 255, 255));
      const std::string lab = t.chunks == 1 ? std::string("all") : x.blocks > 1 ? fmt("c%d-c%d", x.chunk, x.chunk + x.blocks - 1)
                                                                                  : fmt("c%d", x.chunk);
      dl->AddText(small, small->FontSize, ImVec2(p.x - box / 2, p.y + box * 0.38f), col::kText, lab.c_str());
    }
  }

  // nodes, and the chunk each rank owns after reduce-scatter
  for (int r = 0; r < n; ++r) {
    const ImVec2 p = pos[static_cast<size_t>(r)];
    dl->AddCircleFilled(p, node_r, rank_color(r));
    dl->AddCircle(p, node_r, IM_COL32(20, 20, 20, 255), 0, 2.0f);
    const std::string name = fmt("%d", r);
    ImGui::PushFont(font(FontId::Bold));
    const ImVec2 ts = ImGui::CalcTextSize(name.c_str());
    dl->AddText(ImVec2(p.x - ts.x / 2, p.y - ts.y / 2), text_on(rank_color(r)), name.c_str());
    ImGui::PopFont();
    const int own = owned_chunk(t, r);
    if (own >= 0) {
      const std::string o = t.chunks == 1 ? std::string("the sum") : fmt("owns c%d", own);
      const float ox = p.x - center.x, oy = p.y - center.y, ol = std::sqrt(ox * ox + oy * oy) + 1e-3f;
      const ImVec2 os = small->CalcTextSizeA(small->FontSize, FLT_MAX, 0, o.c_str());
      const float off = node_r + 6 + std::fabs(ox / ol) * os.x * 0.5f + std::fabs(oy / ol) * os.y * 0.5f;
      const ImVec2 op(p.x + ox / ol * off - os.x / 2, p.y + oy / ol * off - os.y / 2);
      dl->AddText(small, small->FontSize, op, col::kDim, o.c_str());
    }
  }
  // hover a node: its bytes
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  for (int r = 0; r < n; ++r) {
    const ImVec2 p = pos[static_cast<size_t>(r)];
    if ((mouse.x - p.x) * (mouse.x - p.x) + (mouse.y - p.y) * (mouse.y - p.y) > node_r * node_r) continue;
    ImGui::BeginTooltip();
    ImGui::Text("%s", d.member(r).c_str());
    if (r < static_cast<int>(t.rank_bytes_sent.size()))
      ImGui::Text("sent %s in %d messages in this %s", fmt_bytes(static_cast<double>(t.rank_bytes_sent[static_cast<size_t>(r)])).c_str(),
                  t.rank_messages[static_cast<size_t>(r)], t.op.c_str());
    const int own = owned_chunk(t, r);
    if (own >= 0 && t.chunks == 1) ImGui::Text("holds the full sum after the %s", t.op == "reduce" ? "reduce" : "gather");
    else if (own >= 0) ImGui::Text("owns chunk %d: it holds that chunk's full sum after reduce-scatter", own);
    ImGui::EndTooltip();
  }
}

// ---- 3. the side panel ----

// What happens in a phase, in the words of the collective's algorithm.
const char* phase_text(const CollectiveTrace& t, lab::Phase p) {
  const bool tree = t.algorithm == "tree", naive = t.algorithm == "naive";
  const bool doubling = tree && t.bytes <= lab::kTreeDoublingBytes;
  const bool rs = t.op == "reduce_scatter", ag = t.op == "allgather";
  switch (p) {
    case lab::Phase::ReduceScatter:
      if (rs && tree)
        return "Reduce-scatter by halving (a collective of its own, FSDP's): each rank swaps half of its current range "
               "of blocks with its partner and adds the half it keeps; after log2 N steps rank r holds block r summed "
               "over all ranks: its shard of the gradient.";
      if (rs)
        return "Reduce-scatter (a collective of its own, FSDP's): every rank sends one block to its right neighbour, "
               "which adds it into its own copy. Block b starts at rank b+1 and, N-1 steps later, ends summed over all "
               "ranks at rank b: rank r's shard is block r.";
      if (doubling)
        return "Recursive doubling (a buffer up to 64 KiB): partners 2^k apart swap their whole partial sums and both "
               "add; after log2 p steps every rank of the power-of-two core holds the full sum.";
      if (tree)
        return "Reduce-scatter by halving: each rank swaps half of its current range of chunks with its partner and "
               "adds the half it keeps; after log2 p steps rank r holds chunk r summed over all ranks: it owns it.";
      return "Reduce-scatter: every rank sends one chunk to its right neighbour, which adds it into its own copy of "
             "that chunk. After N-1 steps rank r holds chunk (r+1) mod N summed over all ranks: it owns it.";
    case lab::Phase::Allgather:
      if (ag && tree)
        return "Allgather by doubling (FSDP's parameters): each rank sends its finished range of blocks to its partner "
               "and copies the partner's; after log2 N steps every rank holds every rank's shard: the whole flat "
               "parameter.";
      if (ag)
        return "Allgather (FSDP's parameters): every rank forwards one block to its right neighbour, which keeps a "
               "copy; after N-1 steps every rank holds every rank's shard: the whole flat parameter.";
      if (tree)
        return "Allgather by doubling: each rank sends its finished range to its partner and copies the partner's: "
               "the finished range doubles every step until every rank holds every chunk.";
      return "Allgather: every rank forwards a finished chunk; the receiver overwrites its copy. After N-1 more steps "
             "every rank holds every finished chunk, bit for bit the same.";
    case lab::Phase::Broadcast:
      if (naive && ag)
        return "Broadcast: rank 0 sends the gathered buffer, every block, to one rank per step. Rank 0's link carries "
               "N-1 whole buffers out.";
      if (naive)
        return "Broadcast: rank 0 sends the sum to one rank per step. Rank 0's link carries N-1 whole buffers out, as "
               "it carried N-1 in.";
      if (tree)
        return "Fold-out: each rank past the power-of-two core gets the result from its partner r - p.";
      if (t.op == "replicate")
        return "Replicate: device 0 copies its parameters and buffers to every device, every iteration (replica 0 is "
               "the module itself, so only its BatchNorm updates survive).";
      return "Broadcast: the root's bytes travel down a chain of ranks, segment by segment.";
    case lab::Phase::Gather:
      if (naive && ag) return "Gather: one rank per step sends its block to rank 0.";
      if (naive)
        return "Gather: one rank per step sends its whole buffer to rank 0, which adds it in rank order. Rank 0 does "
               "every addition and receives N-1 whole buffers: the parameter server's bottleneck.";
      if (tree)
        return "Fold-in: each rank past the largest power of two p sends its whole buffer to rank r - p, which adds "
               "it; it then waits for the fold-out.";
      if (t.op == "gather") return "Gather: every device sends its outputs to device 0, which computes the loss.";
      return "Gather: ranks send their data to one rank, which combines it.";
    case lab::Phase::Scatter:
      if (rs) return "Scatter: rank 0 sends each rank its block of the sum, one rank per step.";
      return "Scatter: device 0 sends every device its slice of the batch (torch.chunk), or of the gradients of the "
             "outputs.";
    case lab::Phase::Reduce:
      return "Reduce: every device sends its whole gradient buffer to device 0, which adds them in device order and "
             "takes the optimizer step. No allreduce: device 0 receives N-1 buffers, the others only send.";
    default:
      return "";
  }
}

// The rule of the shown collective with its live numbers: what each rank sends, by algorithm.
void draw_rule(const RunData& d, const CollectiveTrace& t, int settled) {
  const int n = std::max(1, t.world);
  const double S = static_cast<double>(t.bytes);
  if (t.op == "reduce") {  // DataParallel: every device's gradients into device 0
    double each = 0;  // one device's whole gradient buffer: what each transfer carries
    for (const Transfer& x : t.transfers) each = std::max(each, static_cast<double>(x.bytes));
    labeled_value("gradients S", fmt_bytes(each), "S = one device's gradients: every parameter's, 4 bytes a float.");
    labeled_value("device 0 receives",
                  fmt("(N-1) x S = %d x %s = %s", n - 1, fmt_bytes(each).c_str(), fmt_bytes((n - 1) * each).c_str()),
                  "DataParallel reduces, it does not allreduce: every other device sends its whole gradient buffer to "
                  "device 0, which adds them. A ring allreduce would have every rank send 2(N-1)/N x S instead, "
                  "spread over all links.");
    return;
  }
  if (t.op != "allreduce" || n <= 1) {
    if (S > 0) labeled_value("buffer", fmt_bytes(S), "Bytes of this collective's buffer.");
    return;
  }
  labeled_value("buffer S", fmt_bytes(S),
                fmt("S = the bytes allreduced (%s floats x 4 bytes): %s.", fmt_count(S / 4).c_str(),
                    t.what == "param average" ? "every parameter, divided by N first (local SGD's averaging)"
                                              : "this bucket's gradients"));
  if (t.algorithm == "naive") {
    ImGui::SameLine();
    labeled_value("rank 0 sends", fmt("(N-1) x S = %s", fmt_bytes((n - 1) * S).c_str()),
                  "Naive: every other rank sends S to rank 0 and gets S back; rank 0 receives (N-1) x S and sends "
                  "(N-1) x S. A ring sends 2(N-1)/N x S per rank, spread over every link.");
    labeled_value("rank 0's link carries", fmt("2(N-1) x S = %s", fmt_bytes(2.0 * (n - 1) * S).c_str()),
                  fmt("in %d messages; every other rank's link carries 2 x S.", 2 * (n - 1)));
  } else if (t.algorithm == "tree") {
    int levels = 0, p = 1;
    while (p * 2 <= n) {
      p *= 2;
      ++levels;
    }
    const bool doubling = t.bytes <= lab::kTreeDoublingBytes;
    ImGui::SameLine();
    if (doubling)
      labeled_value("each rank sends", fmt("log2(p) x S = %d x %s = %s", levels, fmt_bytes(S).c_str(), fmt_bytes(levels * S).c_str()),
                    "Recursive doubling (buffers up to 64 KiB): log2(p) steps, each moving the whole buffer: fewer "
                    "waits on peers, which is what costs when messages are small.");
    else
      labeled_value("each rank sends", fmt("about 2(p-1)/p x S = %s", fmt_bytes(2.0 * (p - 1) / p * S).c_str()),
                    fmt("Halving-doubling: 2 log2(p) = %d messages where a ring needs 2(N-1) = %d; the same bytes as a "
                        "ring of p ranks.",
                        2 * levels, 2 * (n - 1)));
    if (n > p)
      labeled_value("ranks past p", fmt("%d of %d", n - p, n),
                    fmt("p = %d, the largest power of two <= N. Ranks %d..%d fold their buffers into ranks 0..%d first "
                        "and get the result back last: one extra step each way.",
                        p, p, n - 1, n - p - 1));
  } else {
    const double rule = 2.0 * (n - 1) / n * S;
    ImGui::SameLine();
    labeled_value("chunk", fmt_bytes(S / n), fmt("chunk = S / N = %s / %d (the first S mod N chunks are one float longer)",
                                                 fmt_bytes(S).c_str(), n));
    labeled_value("each rank sends", fmt("2(N-1)/N x S = 2x%d/%d x %s = %s", n - 1, n, fmt_bytes(S).c_str(), fmt_bytes(rule).c_str()),
                  "Ring allreduce: N-1 reduce-scatter steps and N-1 allgather steps, one chunk of S/N each: "
                  "2(N-1) messages, 2(N-1)/N x S bytes per rank, almost 2S however many ranks there are.");
  }
  const Bandwidth bw = allreduce_bandwidth(t);
  if (bw.valid) {
    labeled_value("algbw", fmt_rate(bw.algbw),
                  fmt("algbw = S / t = %s / %.3g ms.\nt: the shortest of the ranks' times for this call (the last rank "
                      "to arrive waits least; the others' times include waiting for it)%s.",
                      fmt_bytes(S).c_str(), bw.seconds * 1e3, d.gate_delay_s > 0 ? ", including the slow-motion wait" : ""));
    ImGui::SameLine();
    labeled_value("busbw", fmt_rate(bw.busbw),
                  fmt("busbw = algbw x 2(N-1)/N = %s x 2x%d/%d: nccl-tests' bus bandwidth, the same formula for every "
                      "algorithm, so algorithms and world sizes compare (a ring's links each carry it).",
                      fmt_rate(bw.algbw).c_str(), n - 1, n));
  }
  // per rank: how far along its share each rank is
  if (ImGui::BeginTable("ring_ranks", 4, ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg)) {
    ImGui::TableSetupColumn("rank");
    ImGui::TableSetupColumn("messages sent");
    ImGui::TableSetupColumn("bytes sent");
    ImGui::TableSetupColumn("of its share");
    ImGui::TableHeadersRow();
    tooltip("Measured from each rank's Chunk events of this collective, up to the shown step, against what the "
            "algorithm has the rank send in the whole call.");
    for (int r = 0; r < n; ++r) {
      uint64_t sent = 0;
      int msgs = 0;
      for (const Transfer& x : t.transfers)
        if (x.src == r && x.global_step < settled) {
          sent += x.bytes;
          ++msgs;
        }
      const RankSends share = allreduce_rank_sends(t.algorithm.empty() ? "ring" : t.algorithm, n, t.bytes, r);
      ImGui::TableNextColumn();
      ImGui::TextColored(rank_color_vec(r), "%d", r);
      ImGui::TableNextColumn();
      ImGui::Text("%d of %d", msgs, share.messages);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_bytes(static_cast<double>(sent)).c_str());
      ImGui::TableNextColumn();
      ImGui::Text("%.0f%%", share.bytes > 0 ? 100.0 * static_cast<double>(sent) / static_cast<double>(share.bytes) : 0.0);
    }
    ImGui::EndTable();
  }
}

void draw_side(const RunData& d, RingViewState& st, const Shown& sh) {
  const CollectiveTrace& t = st.trace;
  const int n = std::max(1, t.world);
  const int total = expected_steps(t);
  heading(fmt("%s #%llu", t.op.c_str(), static_cast<unsigned long long>(t.op_seq)).c_str());
  ImGui::SameLine();
  const std::string which = t.what + (t.tag >= 0 ? fmt(" %d", t.tag) : "") +
                            fmt(", iteration %lld", static_cast<long long>(t.train_step)) +
                            (t.algorithm.empty() ? "" : ", " + t.algorithm);
  ImGui::TextDisabled("%s", which.c_str());
  note_item("value", "collective", true, which);
  tooltip("op_seq numbers the collectives of a run; it is the same on every rank. 'grad bucket k' is DDP's k-th "
          "gradient bucket; 'param average' is local SGD's averaging; 'buffers' is the BatchNorm buffer broadcast; "
          "'bn stats' is SyncBatchNorm; DataParallel's are scatter, replicate, gather and reduce.");

  // phase and step
  const std::vector<PhaseSteps> phases = expected_phases(t);
  std::vector<lab::Phase> step_phase;  // per global step
  for (const PhaseSteps& x : phases) step_phase.insert(step_phase.end(), static_cast<size_t>(x.steps), x.phase);
  lab::Phase ph = lab::Phase::None;
  int in_phase = 0, phase_len = 0;
  const int cur = sh.anim_step >= 0 ? sh.anim_step : std::max(0, sh.steps_done - 1);
  for (const Transfer& x : t.transfers)
    if (x.global_step == cur) {
      ph = x.phase;
      in_phase = x.ring_step;
    }
  for (const PhaseSteps& x : phases)
    if (x.phase == ph) phase_len = x.steps;
  if (ph != lab::Phase::None) {
    const std::string step = fmt("%s step %d of %d  (step %d of %d overall)", lab::phase_name(ph), in_phase + 1,
                                 std::max(phase_len, in_phase + 1), cur + 1, total);
    ImGui::TextUnformatted(step.c_str());
    note_item("value", "step", true, step);
  } else
    ImGui::TextDisabled("no transfers (world size 1)");
  // a strip of all steps: combining (blue) then copying (green)
  {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 p0 = ImGui::GetCursorScreenPos();
    const float w = ImGui::GetContentRegionAvail().x, h = ImGui::GetFontSize() * 0.7f;
    const float sw = w / static_cast<float>(std::max(1, total));
    for (int k = 0; k < total; ++k) {
      const lab::Phase kp = k < static_cast<int>(step_phase.size()) ? step_phase[static_cast<size_t>(k)] : ph;
      ImU32 c = combining(kp) ? IM_COL32(0, 114, 178, 255) : IM_COL32(0, 158, 115, 255);
      if (k >= sh.steps_done) c = with_alpha(c, 0.25f);
      dl->AddRectFilled(ImVec2(p0.x + sw * static_cast<float>(k) + 1, p0.y), ImVec2(p0.x + sw * static_cast<float>(k + 1) - 1, p0.y + h), c);
      if (k == cur) dl->AddRect(ImVec2(p0.x + sw * static_cast<float>(k), p0.y - 1), ImVec2(p0.x + sw * static_cast<float>(k + 1), p0.y + h + 1), col::kText, 0, 0, 2);
    }
    ImGui::Dummy(ImVec2(w, h + 2));
    tooltip("The collective's steps: blue = combining (reduce-scatter, gather, reduce), green = copying (allgather, "
            "broadcast, scatter); faded: not yet.");
  }
  ImGui::PushTextWrapPos(0);
  ImGui::TextDisabled("%s", phase_text(t, ph));
  ImGui::PopTextWrapPos();

  // buffers table
  ImGui::Spacing();
  ImGui::TextUnformatted(sh.anim_step >= 0 && sh.progress < 1.0f ? "What each rank's buffer holds (before the step in flight)"
                                                                   : "What each rank's buffer holds");
  help_marker(t.chunks == 1 ? "One box per rank: its whole buffer. Its stripes are the ranks whose data is summed into "
                              "it; grey: not yet. A white frame marks the rank that holds the full sum."
                            : "One box per chunk (a part of the buffer as the algorithm cuts it). Its stripes are the "
                              "ranks whose data is summed into this rank's copy of the chunk; grey: not yet. A white "
                              "frame marks the chunk the rank owns (fully summed) after the combining steps.");
  const BufferState bs = buffer_state(t, sh.settled());
  {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float fs = ImGui::GetFontSize();
    const float avail = ImGui::GetContentRegionAvail().x - fs * 3.5f;
    const float bw = std::clamp(avail / static_cast<float>(std::max(1, bs.chunks)) - 3, 6.0f, fs * 3.2f);
    const float bh = std::clamp(fs * 1.0f, 8.0f, bw * 0.8f + 6);
    for (int r = 0; r < bs.world; ++r) {
      const ImVec2 p0 = ImGui::GetCursorScreenPos();
      dl->AddText(p0, rank_color(r), (d.caps().master_device ? fmt("dev %d", r) : d.member(r)).c_str());
      const int own = owned_chunk(t, r);
      for (int c = 0; c < bs.chunks; ++c) {
        const ImVec2 a(p0.x + fs * 3.5f + static_cast<float>(c) * (bw + 3), p0.y + 1);
        chunk_box(dl, a, ImVec2(a.x + bw, a.y + bh), bs.at(r, c), bs.world, c == own, IM_COL32(255, 255, 255, 255));
      }
      ImGui::Dummy(ImVec2(fs * 3.5f + static_cast<float>(bs.chunks) * (bw + 3), bh + 3));
    }
  }

  // the rule with the live numbers
  ImGui::Spacing();
  draw_rule(d, t, sh.settled());
  // per-link bytes
  const std::vector<LinkBytes> links = link_bytes(t, sh.settled());
  if (!links.empty()) {
    std::string s;
    uint64_t total_b = 0;
    for (const LinkBytes& l : links) {
      s += fmt("%d -> %d: %s in %d message(s)\n", l.src, l.dst, fmt_bytes(static_cast<double>(l.bytes)).c_str(), l.messages);
      total_b += l.bytes;
    }
    labeled_value("links", fmt("%zu used, %s so far", links.size(), fmt_bytes(static_cast<double>(total_b)).c_str()),
                  "Bytes per link (src -> dst) in this collective so far:\n" + s);
  }
  (void)n;
}

// ---- 4. the view ----

// What the view shows, in words, before there is anything to show.
std::string intro(const RunData& d) {
  const lab::RunConfig& c = d.cfg;
  if (d.caps().master_device)
    return "With DataParallel there is no allreduce. One process drives the devices and device 0 is the hub: each "
           "iteration it scatters the batch, replicates its parameters and buffers to every device, gathers the "
           "outputs, computes the loss, scatters the output gradients and receives every device's gradients (reduce), "
           "which it adds before its optimizer step. Every arrow touches device 0. 'every transfer' shows all of them.";
  std::string s = d.caps().averages_parameters
                      ? "Local SGD allreduces gradients only in its first warmup_steps iterations; after that every "
                        "rank steps on its own gradients and the parameters are averaged (an allreduce of 'param "
                        "average') every average_every iterations. "
                      : "This view shows how DDP sums the gradients. ";
  if (c.allreduce == "naive")
    s += "Naive allreduce, the parameter-server picture: every rank sends its whole buffer to rank 0, one per step, "
         "which adds them in rank order and sends the sum back. Rank 0's link carries 2(N-1) buffers.";
  else if (c.allreduce == "tree")
    s += "Tree allreduce, recursive halving-doubling: in each reduce-scatter step every rank swaps half of its range "
         "of chunks with a partner and adds the half it keeps; the allgather doubles the ranges back. 2 log2(N) steps "
         "instead of the ring's 2(N-1); buffers up to 64 KiB take log2(N) steps of the whole buffer.";
  else
    s += "Ring allreduce: the ranks sit on a circle; in each step every rank sends one chunk (1/N of the buffer) to "
         "its neighbour. N-1 reduce-scatter steps add the chunks up, N-1 allgather steps copy the finished chunks "
         "around: every rank sends 2(N-1)/N of the buffer.";
  return s + " Chunks travel the arrows as the run records them; the table shows what every rank's buffer holds.";
}

}  // namespace

void draw_ring_view(const RunData& d, RingViewState& st, const FrameClock& clock) {
  // controls
  const std::vector<const char*> filters = filter_names(d.caps());
  st.filter = std::clamp(st.filter, 0, static_cast<int>(filters.size()) - 1);
  float combo_w = 0;  // as wide as the longest choice
  for (const char* f : filters) combo_w = std::max(combo_w, ImGui::CalcTextSize(f).x);
  ImGui::SetNextItemWidth(combo_w + ImGui::GetFrameHeight() + ImGui::GetStyle().FramePadding.x * 2);
  if (ImGui::Combo("show", &st.filter, filters.data(), static_cast<int>(filters.size()))) {
    st.have_shown = false;
    st.trace_seq = ~uint64_t{0};
  }
  tooltip(d.caps().master_device
              ? "Which transfers to show: DataParallel's reduce of the gradients into device 0, or every transfer of "
                "an iteration (scatter of inputs and output gradients, replicate, gather of outputs, reduce)."
              : "Which collectives to show: the gradient bucket allreduces (and local SGD's parameter averages), or "
                "also SyncBN's and the evaluation's allreduces, or also broadcasts (BatchNorm buffers) and allgathers "
                "(SyncBN statistics).");
  ImGui::SameLine();
  // A recording has no "newest as it happens": following it replays its last collective.
  const char* follow_label = d.opened() ? "last collective" : "follow the run";
  if (ImGui::Checkbox(follow_label, &st.follow) && !st.follow) st.scrub_step = 1 << 20;
  tooltip(d.opened() ? "On: the run's last collective, replayed at 0.7 s per step. Off: choose the step with the "
                       "slider, and go back collective by collective with 'previous'."
                     : "On: paused or in slow motion, the newest collective as it happens; at full speed, the newest "
                       "finished one replayed at 0.7 s per step. Off: choose the step with the slider.");
  note_item("checkbox", follow_label);
  ImGui::SameLine();
  ImGui::TextDisabled("  %s", algorithm_title(d).c_str());
  Shown sh = choose(d, st, clock);
  if (!st.follow && sh.valid) {
    ImGui::SameLine();
    int k = std::min(st.scrub_step, sh.steps_done);
    int maxk = 0;
    for (const Transfer& x : st.trace.transfers) maxk = std::max(maxk, x.global_step + 1);
    k = std::min(std::max(k, 0), maxk);
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 10);
    if (ImGui::SliderInt("steps done", &k, 0, maxk)) st.scrub_step = k;
    else st.scrub_step = k;
    ImGui::SameLine();
    uint64_t prev = 0;
    note_item("slider", "steps done");
    if (ImGui::SmallButton("previous") &&
        previous_collective(d.events, filter_of(st.filter, d.cfg), st.shown_seq, prev)) {
      st.shown_seq = prev;
      st.scrub_step = 1 << 20;
    }
    tooltip("The collective before this one.");
  }
  if (!sh.valid) {
    ImGui::Spacing();
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("%s", intro(d).c_str());
    ImGui::PopStyleColor();
    ImGui::Spacing();
    if (d.world() <= 1)
      ImGui::TextWrapped("World size 1: nothing to allreduce. Choose world_size 2 or more in Settings and press Apply.");
    else if (d.phase == RunPhase::Loading)
      ImGui::TextDisabled("loading the dataset and building %d replicas...", d.world());
    else if (d.phase == RunPhase::Failed && d.steps_done() == 0)
      text_wrapped_colored(col::kError, "The run failed before any collective: " + d.error);
    else {
      const std::string none = nothing_recorded(d, "collectives", "Press Play, or step (Right arrow) while paused.");
      text_wrapped_colored(col::kDim, none);
    }
    return;
  }
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float ring_size = std::max(120.0f, std::min(avail.x * 0.55f, avail.y - ImGui::GetFontSize() * 1.6f));
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  ImGui::Dummy(ImVec2(ring_size, ring_size));
  ImGui::GetWindowDrawList()->PushClipRect(origin, ImVec2(origin.x + ring_size, origin.y + ring_size), true);
  draw_ring(d, st, sh, origin, ring_size);
  ImGui::GetWindowDrawList()->PopClipRect();
  ImGui::GetWindowDrawList()->PushClipRect(origin, ImVec2(origin.x + avail.x, origin.y + ring_size + ImGui::GetFontSize() * 1.6f), true);
  ImGui::GetWindowDrawList()->AddText(ImVec2(origin.x, origin.y + ring_size + ImGui::GetFontSize() * 0.3f), col::kFaint,
                                      "arrows: every transfer of this collective; boxes: chunks in flight (stripes: "
                                      "whose data they carry); labels: bytes per link so far");
  ImGui::GetWindowDrawList()->PopClipRect();
  ImGui::SameLine();
  ImGui::BeginChild("ring_side", ImVec2(0, ring_size), false);
  draw_side(d, st, sh);
  ImGui::EndChild();
}

}  // namespace viz
