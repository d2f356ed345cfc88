#include "bench_layouts.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "errors.h"
#include "events.h"
#include "grid.h"
#include "group_transport.h"

namespace lab {

namespace {

std::string layout_name(const LayoutResult& l) {
  return std::to_string(l.dp) + " x " + std::to_string(l.pp) + " x " + std::to_string(l.tp);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

std::vector<LayoutResult> plan_layouts(const BenchLayoutsOptions& opt) {
  const int n = opt.base.world_size;
  if (n < 1) throw ConfigError("--world-size must be at least 1, got " + std::to_string(n));
  if (opt.global_batch < 1)
    throw ConfigError("--global-batch must be at least 1, got " + std::to_string(opt.global_batch));
  if (opt.steps < 1) throw ConfigError("--steps must be at least 1, got " + std::to_string(opt.steps));
  if (opt.microbatches < 1)
    throw ConfigError("--microbatches must be at least 1, got " + std::to_string(opt.microbatches));
  std::vector<LayoutResult> out;
  for (int dp = n; dp >= 1; --dp) {
    if (n % dp) continue;
    for (int pp = 1; pp <= n / dp; ++pp) {
      if ((n / dp) % pp) continue;
      LayoutResult l;
      l.dp = dp;
      l.pp = pp;
      l.tp = n / dp / pp;
      RunConfig& c = l.cfg;
      c = opt.base;
      c.world_size = n;
      c.dp = 1, c.tp = 0, c.stages = 0;
      c.steps = opt.steps + 1;  // one that warms up
      c.epochs = 0;
      c.eval_every = 0;
      c.out_dir.clear();
      c.overwrite = false;
      // the run's samples: every iteration a fresh global batch (no epoch boundary inside it)
      c.limit_train = opt.global_batch * (opt.steps + 1);
      if (c.limit_test == 0) c.limit_test = 64;
      const int64_t per_replica = opt.global_batch / dp;
      c.batch_size = per_replica;
      if (pp > 1) {
        c.mode = "pipeline";
        c.stages = pp;
        c.dp = dp;
        c.tp = l.tp > 1 ? l.tp : 0;
        c.microbatches = std::max<int64_t>(1, std::min(opt.microbatches, per_replica));
      } else if (l.tp > 1) {
        c.mode = "tensor";
        c.tp = l.tp;
        c.dp = dp;
      } else {
        c.mode = "ddp";
      }
      if (opt.global_batch % dp != 0)
        l.refused = "--global-batch " + std::to_string(opt.global_batch) + " is not a multiple of " +
                    std::to_string(dp) + " data-parallel replicas";
      else
        try {
          validate(c);
        } catch (const ConfigError& e) {
          l.refused = e.what();
        }
      out.push_back(std::move(l));
    }
  }
  return out;
}

void measure_layout(LayoutResult& l, const WorldFactory& make_world) {
  Run run(l.cfg, make_world);
  run.run();
  const int n = l.cfg.world_size;
  std::vector<std::vector<Event>> events(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) run.events(r).copy_since(0, events[static_cast<size_t>(r)]);
  // The span of each iteration over every rank's events, and the bytes each rank sent in it
  std::map<int64_t, std::pair<double, double>> span;  // step -> (first start, last end)
  std::vector<double> sent(static_cast<size_t>(n), 0.0);
  std::set<int64_t> steps;
  for (const auto& rank_events : events)
    for (const Event& e : rank_events) {
      if (e.train_step < 0) continue;
      auto it = span.find(e.train_step);
      if (it == span.end()) it = span.emplace(e.train_step, std::make_pair(e.t_start, e.t_end)).first;
      it->second.first = std::min(it->second.first, e.t_start);
      it->second.second = std::max(it->second.second, e.t_end);
      steps.insert(e.train_step);
      if (e.kind == EventKind::Chunk && e.src >= 0 && e.src < n) sent[static_cast<size_t>(e.src)] += e.bytes;
    }
  std::vector<double> ms;
  for (const auto& [step, s] : span)
    if (step > 0) ms.push_back(1e3 * (s.second - s.first));  // (iteration 0 warms up)
  l.ms_per_iteration = median(ms);
  const double iterations = static_cast<double>(std::max<size_t>(1, steps.size()));
  GridShape g;
  g.dp = l.dp, g.pp = l.pp, g.tp = l.tp;
  const nlohmann::json by_group = grid_summary(g, events)["bytes_per_iteration_by_group"];
  l.bytes_by_group.clear();
  // Messages over the whole world belong to the grid's only axis of more than one rank, when it has
  // one (DDP's world is its data-parallel group; --mode tensor without --dp, its tensor group)
  const int axes = (g.dp > 1) + (g.pp > 1) + (g.tp > 1);
  const std::string world_is = axes != 1 ? "world" : g.dp > 1 ? "dp" : g.pp > 1 ? "pp" : "tp";
  for (const auto& [name, b] : by_group.items()) l.bytes_by_group[name == "world" ? world_is : name] += b.get<double>();
  l.busiest_rank = static_cast<int>(std::max_element(sent.begin(), sent.end()) - sent.begin());
  l.busiest_rank_bytes = sent[static_cast<size_t>(l.busiest_rank)] / iterations;
  l.wire_ms = l.cfg.link_gbps > 0 ? 1e3 * l.busiest_rank_bytes * 8.0 / (l.cfg.link_gbps * 1e9) : 0.0;
}

int bench_layouts(const BenchLayoutsOptions& opt, const WorldFactory& make_world) {
  std::FILE* out = opt.out ? opt.out : stdout;
  std::vector<LayoutResult> layouts = plan_layouts(opt);
  const RunConfig& b = opt.base;
  std::fprintf(out, "dtlab %s bench layouts | model=%s world_size=%d global_batch=%lld steps=%lld (after 1 warm-up) "
                    "link=%s\n",
               kDtlabVersion, b.model.c_str(), b.world_size, static_cast<long long>(opt.global_batch),
               static_cast<long long>(opt.steps),
               b.link_model() ? (std::to_string(b.link_gbps) + " Gbit/s, " + std::to_string(b.link_latency_us) + " us")
                                    .c_str()
                              : "none (in-memory)");
  for (LayoutResult& l : layouts) {
    if (!l.refused.empty()) continue;
    std::fprintf(out, "  running dp %d x pp %d x tp %d (--mode %s)...\n", l.dp, l.pp, l.tp, l.cfg.mode.c_str());
    std::fflush(out);
    measure_layout(l, make_world);
  }
  std::vector<const LayoutResult*> ran;
  for (const LayoutResult& l : layouts)
    if (l.refused.empty()) ran.push_back(&l);
  std::stable_sort(ran.begin(), ran.end(),
                   [](const LayoutResult* a, const LayoutResult* c) { return a->ms_per_iteration < c->ms_per_iteration; });
  std::fprintf(out, "\n%-14s %-9s %9s %12s %10s %10s %10s %12s %10s %9s\n", "dp x pp x tp", "mode", "batch/rep",
               "ms/iteration", "dp MB/it", "pp MB/it", "tp MB/it", "busiest rank", "its MB/it", "wire ms");
  auto mb = [](const LayoutResult& l, const char* k) {
    const auto it = l.bytes_by_group.find(k);
    return it == l.bytes_by_group.end() ? 0.0 : it->second / 1e6;
  };
  for (const LayoutResult* l : ran)
    std::fprintf(out, "%-14s %-9s %9lld %12.2f %10.3f %10.3f %10.3f %12d %10.3f %9.2f\n", layout_name(*l).c_str(),
                 l->cfg.mode.c_str(), static_cast<long long>(l->cfg.batch_size), l->ms_per_iteration, mb(*l, "dp"),
                 mb(*l, "pp"), mb(*l, "tp"), l->busiest_rank, l->busiest_rank_bytes / 1e6, l->wire_ms);
  for (const LayoutResult& l : layouts)
    if (!l.refused.empty()) std::fprintf(out, "%-14s refused: %s\n", layout_name(l).c_str(), l.refused.c_str());
  std::fprintf(out, "(the time is this machine's: %d ranks share its cores; the bytes, and the wire's lower bound on "
                    "the busiest rank's link, are the layout's wherever it runs)\n",
               b.world_size);
  nlohmann::json j = {{"command", "bench layouts"},
                      {"producer", std::string("dtlab ") + kDtlabVersion},
                      {"model", b.model},
                      {"world_size", b.world_size},
                      {"global_batch", opt.global_batch},
                      {"steps", opt.steps},
                      {"link", {{"gbps", b.link_gbps}, {"latency_us", b.link_latency_us}}}};
  nlohmann::json arr = nlohmann::json::array();
  for (const LayoutResult& l : layouts)
    arr.push_back({{"dp", l.dp}, {"pp", l.pp}, {"tp", l.tp}, {"mode", l.cfg.mode}, {"batch_size", l.cfg.batch_size},
                   {"microbatches", l.pp > 1 ? l.cfg.microbatches : 1}, {"refused", l.refused},
                   {"ms_per_iteration", l.ms_per_iteration}, {"bytes_per_iteration_by_group", l.bytes_by_group},
                   {"busiest_rank", l.busiest_rank}, {"busiest_rank_bytes", l.busiest_rank_bytes},
                   {"wire_ms", l.wire_ms}});
  j["layouts"] = arr;
  if (ran.empty()) {
    std::fprintf(out, "no layout of %d ranks ran: every one was refused\n", b.world_size);
    return 2;
  }
  const double ratio = ran.front()->ms_per_iteration > 0 ? ran.back()->ms_per_iteration / ran.front()->ms_per_iteration : 0;
  j["fastest"] = layout_name(*ran.front());
  j["ratio_slowest_fastest"] = ratio;
  if (!opt.json_out.empty()) {
    std::ofstream f(opt.json_out);
    if (!f) throw ConfigError("--json " + opt.json_out + ": cannot be written");
    f << j.dump(1) << "\n";
  }
  std::fprintf(out, "fastest: dp %d x pp %d x tp %d, %.2f ms per iteration\n", ran.front()->dp, ran.front()->pp,
               ran.front()->tp, ran.front()->ms_per_iteration);
  std::fprintf(out, "ratio slowest/fastest layout %.2f\n", ratio);
  return 0;
}

}  // namespace lab
