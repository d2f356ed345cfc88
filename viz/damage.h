// Damage: the parts of the window that changed since the last drawn frame, found by comparing
// Dear ImGui's draw data with the previous frame's. Mesa's software renderer (llvmpipe) pays for
// every pixel it draws, and while a run trains what changes between frames is small (numbers,
// the newest points of a curve, a chunk moving along an arrow): redrawing only those rectangles
// leaves the CPU to the ranks. The app uses it where the back buffer survives a swap (see
// app_glfw.cpp); elsewhere every frame is drawn whole.
//
// How: per draw list (one per window), the old and new vertex sequences (position, uv, colour)
// are compared as a diff: runs that are the same in both, in the same order, are matched (an
// anchor search resynchronizes after each difference), and every vertex outside them has
// changed. Every triangle that uses a changed vertex, in the old frame or the new, adds its
// bounding box, cut to its clip rectangle; neighbouring boxes are merged. A command whose clip
// rectangle or texture changed is dirty where it draws in either frame, and so is a list that
// appears, disappears or changes its number of commands; a change of the windows' order
// redraws everything.
//
// Cost: linear in the vertices and indices, on buffers kept from frame to frame (large
// allocations every frame cost page faults).
#pragma once

#include <cstdint>
#include <vector>

#include <imgui.h>

namespace viz {

struct DirtyRect {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // display coordinates
  float area() const { return (x1 - x0) * (y1 - y0); }
};

// Merges rectangles that are within `gap` pixels of each other, then the pairs whose union grows
// least, until at most `max` remain. The result's rectangles are at least `gap` apart: they never
// overlap, so they can be cleared and drawn in one pass.
std::vector<DirtyRect> merge_rects(std::vector<DirtyRect> rects, size_t max, float gap);

class DamageTracker {
 public:
  // Compares dd with the last frame given here. full: the whole window must be drawn (first
  // frame, new size, windows reordered); otherwise the returned rectangles are what changed
  // (empty: nothing did). At most kMaxRects rectangles, pairwise at least kGap pixels apart.
  std::vector<DirtyRect> update(const ImDrawData& dd, bool& full);
  void invalidate() { m_valid = false; }

  static constexpr int kMaxRects = 24;
  static constexpr float kGap = 8;

  struct Cmd {
    ImVec4 clip;
    ImTextureID texture;
    unsigned int vtx_offset, idx_offset, elems;
  };
  struct List {
    const ImDrawList* key = nullptr;
    std::vector<ImDrawVert> vtx;
    std::vector<ImDrawIdx> idx;
    std::vector<Cmd> cmds;
  };

 private:
  std::vector<List> m_prev, m_now;  // swapped every frame; their buffers are reused
  std::vector<char> m_old_changed, m_new_changed;
  std::vector<uint64_t> m_hash;
  std::vector<int64_t> m_head, m_next;
  ImVec2 m_size{0, 0};
  bool m_valid = false;
};

}  // namespace viz
