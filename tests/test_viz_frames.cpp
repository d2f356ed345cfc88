// The window's frames: frame-time percentiles (viz/data/frame_stats.h) and what a frame drew, as
// JSON (viz/data/drawn_items.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "drawn_items.h"
#include "frame_stats.h"

TEST(VizFrameStats, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  const viz::Percentiles p = viz::percentiles(v);
  EXPECT_EQ(p.p50, 50);
  EXPECT_EQ(p.p95, 95);
  EXPECT_EQ(p.p99, 99);
  EXPECT_EQ(p.max, 100);
  EXPECT_EQ(viz::percentiles({}).max, 0);
}

TEST(VizFrameStats, OnlyFramesDrawnWhileTrainingCount) {
  viz::FrameStats f;
  std::array<viz::FramePartTime, viz::kFrameParts> parts{};
  parts[static_cast<size_t>(viz::FramePart::Render)] = {8.0, 6.0};
  f.add(2.0, 0, 0, parts, false);     // while the data loads: cheap, not counted
  f.add(10.0, 0, 1.0, parts, true);   // the first training frame has no interval
  f.add(20.0, 50.0, 3.0, parts, true);
  f.add(1.0, 40.0, 0, parts, false);  // after the run
  EXPECT_EQ(f.frames(), 2u);
  EXPECT_EQ(f.all_frames(), 4u);
  EXPECT_EQ(f.frame().p50, 10.0);
  EXPECT_EQ(f.frame().max, 20.0);
  EXPECT_EQ(f.all_frame().max, 20.0);
  EXPECT_EQ(f.all_frame().p50, 2.0);
  EXPECT_EQ(f.interval().max, 50.0);
  EXPECT_EQ(f.interval().p50, 50.0) << "one interval: between the two training frames";
  EXPECT_EQ(f.late().max, 3.0);
  EXPECT_EQ(f.part_mean(viz::FramePart::Render).wall_ms, 8.0);
  EXPECT_EQ(f.part_mean(viz::FramePart::Render).cpu_ms, 6.0);
  EXPECT_EQ(f.part_mean(viz::FramePart::Swap).wall_ms, 0.0);
  const nlohmann::json j = f.to_json({{"extra", 1}});
  EXPECT_EQ(j["frames"].get<int>(), 2);
  EXPECT_EQ(j["all_frames"].get<int>(), 4);
  EXPECT_EQ(j["parts_mean_ms"]["render"]["cpu"].get<double>(), 6.0);
  EXPECT_EQ(j["extra"].get<int>(), 1);
  EXPECT_GT(viz::thread_cpu_seconds(), 0.0);
}

// --screenshot-items: the file the GUI tests read (drawn_items.h).
TEST(VizDrawnItems, WhatAFrameDrewAsJson) {
  viz::DrawnItems items;
  items.window = "Controls";
  items.add("button", "Apply##settings", false);
  items.add("value", "iteration", true, "64 / 64");
  items.window = "Views";
  const float x[] = {32, 64}, y[] = {0.75f, NAN};
  items.add_chart("te_acc", false);
  items.add_series("te_acc", "end of epoch", x, y, 2);
  std::vector<float> many(viz::DrawnItems::kMaxPoints + 1, 1.0f);
  items.add_series("ranks_loss", "rank 0", many.data(), many.data(), static_cast<int>(many.size()));
  const nlohmann::json j = items.to_json("/tmp/x.png", "traineval");
  EXPECT_EQ(j["format"], "dtlab drawn items");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["view"], "traineval");
  const nlohmann::json& it = j["items"];
  ASSERT_EQ(it.size(), 5u);
  EXPECT_EQ(it[0], (nlohmann::json{{"window", "Controls"}, {"kind", "button"}, {"label", "Apply"}, {"enabled", false}}));
  EXPECT_EQ(it[1]["value"], "64 / 64");
  EXPECT_EQ(it[2]["empty"], false);
  EXPECT_EQ(it[3]["window"], "Views");
  EXPECT_EQ(it[3]["x"], (nlohmann::json{32.0, 64.0}));
  EXPECT_TRUE(it[3]["y"][1].is_null()) << "NaN has no JSON number";
  EXPECT_EQ(it[4]["n"], viz::DrawnItems::kMaxPoints + 1);
  EXPECT_FALSE(it[4].contains("x")) << "long series: only their length";
  EXPECT_EQ(viz::drawn_items_path("/tmp/shot-traineval.png"), "/tmp/shot-traineval.items.json");
  EXPECT_EQ(viz::drawn_items_path("shot"), "shot.items.json");
}
