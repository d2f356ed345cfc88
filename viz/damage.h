// Damage: the parts of the window that changed since the last drawn frame, found by comparing
// Dear ImGui's draw data with the previous frame's. Mesa's software renderer (llvmpipe) pays for
// every pixel it draws, and while a run trains what changes between frames is small (numbers,
// the newest points of a curve, a chunk moving along an arrow): redrawing only those rectangles
// leaves the CPU to the ranks. The app uses it where the back buffer survives a swap (see
// app_glfw.cpp); elsewhere every frame is drawn whole.
//
// How: per draw list (one per window), the vertices that differ are found from both ends (what
// precedes and follows a change keeps its place), and every triangle that uses one of them, in the
// old frame or the new, adds its bounding box, cut to its command's clip rectangle. Lists that
// appear, disappear, or change their commands' clip rectangles or textures are dirty as a whole.
#pragma once

#include <vector>

#include <imgui.h>

namespace viz {

struct DirtyRect {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // display coordinates
  float area() const { return (x1 - x0) * (y1 - y0); }
};

class DamageTracker {
 public:
  // Compares dd with the last frame given here. full: the whole window must be drawn (first
  // frame, new size, windows reordered); otherwise the returned rectangles are what changed
  // (empty: nothing did). At most kMaxRects rectangles, merged when they touch.
  std::vector<DirtyRect> update(const ImDrawData& dd, bool& full);
  void invalidate() { m_valid = false; }

  static constexpr int kMaxRects = 8;

 private:
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
    DirtyRect bbox;  // union of the commands' clip rectangles
  };
  static List copy(const ImDrawList& l);
  // Bounding boxes of the triangles of `l` that use a vertex in [first, end), cut to their clips.
  static void add_triangles(const List& l, unsigned int first, unsigned int end, std::vector<DirtyRect>& out);

  std::vector<List> m_prev;
  ImVec2 m_size{0, 0};
  bool m_valid = false;
};

}  // namespace viz
