#include "damage.h"

#include <algorithm>
#include <cstring>

namespace viz {

namespace {

bool same_vertex(const ImDrawVert& a, const ImDrawVert& b) { return std::memcmp(&a, &b, sizeof(ImDrawVert)) == 0; }

DirtyRect unite(const DirtyRect& a, const DirtyRect& b) {
  return {std::min(a.x0, b.x0), std::min(a.y0, b.y0), std::max(a.x1, b.x1), std::max(a.y1, b.y1)};
}

bool near(const DirtyRect& a, const DirtyRect& b, float gap) {
  return a.x0 <= b.x1 + gap && b.x0 <= a.x1 + gap && a.y0 <= b.y1 + gap && b.y0 <= a.y1 + gap;
}

// Merges rectangles that touch (within a few pixels), then the pairs whose union grows least,
// until at most `max` remain.
std::vector<DirtyRect> merge(std::vector<DirtyRect> r, size_t max) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (size_t i = 0; i < r.size() && !changed; ++i)
      for (size_t j = i + 1; j < r.size(); ++j)
        if (near(r[i], r[j], 8)) {
          r[i] = unite(r[i], r[j]);
          r.erase(r.begin() + static_cast<std::ptrdiff_t>(j));
          changed = true;
          break;
        }
  }
  while (r.size() > max) {
    size_t bi = 0, bj = 1;
    float best = -1;
    for (size_t i = 0; i < r.size(); ++i)
      for (size_t j = i + 1; j < r.size(); ++j) {
        const float grow = unite(r[i], r[j]).area() - r[i].area() - r[j].area();
        if (best < 0 || grow < best) {
          best = grow;
          bi = i;
          bj = j;
        }
      }
    r[bi] = unite(r[bi], r[bj]);
    r.erase(r.begin() + static_cast<std::ptrdiff_t>(bj));
  }
  return r;
}

}  // namespace

DamageTracker::List DamageTracker::copy(const ImDrawList& l) {
  List c;
  c.key = &l;
  c.vtx.assign(l.VtxBuffer.Data, l.VtxBuffer.Data + l.VtxBuffer.Size);
  c.idx.assign(l.IdxBuffer.Data, l.IdxBuffer.Data + l.IdxBuffer.Size);
  bool first = true;
  for (const ImDrawCmd& cmd : l.CmdBuffer) {
    if (cmd.UserCallback) continue;
    c.cmds.push_back({cmd.ClipRect, cmd.TextureId, cmd.VtxOffset, cmd.IdxOffset, cmd.ElemCount});
    const DirtyRect r{cmd.ClipRect.x, cmd.ClipRect.y, cmd.ClipRect.z, cmd.ClipRect.w};
    c.bbox = first ? r : unite(c.bbox, r);
    first = false;
  }
  return c;
}

void DamageTracker::add_triangles(const List& l, unsigned int first, unsigned int end, std::vector<DirtyRect>& out) {
  if (first >= end) return;
  for (const Cmd& cmd : l.cmds) {
    bool any = false;
    DirtyRect box;
    for (unsigned int k = 0; k + 2 < cmd.elems + 0u && cmd.idx_offset + k + 2 < l.idx.size(); k += 3) {
      const unsigned int a = cmd.vtx_offset + l.idx[cmd.idx_offset + k];
      const unsigned int b = cmd.vtx_offset + l.idx[cmd.idx_offset + k + 1];
      const unsigned int c = cmd.vtx_offset + l.idx[cmd.idx_offset + k + 2];
      const bool touched = (a >= first && a < end) || (b >= first && b < end) || (c >= first && c < end);
      if (!touched || a >= l.vtx.size() || b >= l.vtx.size() || c >= l.vtx.size()) continue;
      for (unsigned int v : {a, b, c}) {
        const ImVec2 p = l.vtx[v].pos;
        const DirtyRect pr{p.x, p.y, p.x, p.y};
        box = any ? unite(box, pr) : pr;
        any = true;
      }
    }
    if (!any) continue;
    // cut to the clip rectangle, one pixel of margin for anti-aliasing
    box = {std::max(box.x0 - 1, cmd.clip.x), std::max(box.y0 - 1, cmd.clip.y), std::min(box.x1 + 1, cmd.clip.z),
           std::min(box.y1 + 1, cmd.clip.w)};
    if (box.x1 > box.x0 && box.y1 > box.y0) out.push_back(box);
  }
}

std::vector<DirtyRect> DamageTracker::update(const ImDrawData& dd, bool& full) {
  std::vector<List> now;
  now.reserve(static_cast<size_t>(dd.CmdListsCount));
  for (int i = 0; i < dd.CmdListsCount; ++i) now.push_back(copy(*dd.CmdLists[i]));
  std::vector<DirtyRect> dirty;
  full = !m_valid || dd.DisplaySize.x != m_size.x || dd.DisplaySize.y != m_size.y;
  if (!full) {
    // the same windows in the same order (z-order), or everything is redrawn
    std::vector<const ImDrawList*> a, b;
    for (const List& l : m_prev) a.push_back(l.key);
    for (const List& l : now) b.push_back(l.key);
    std::vector<const ImDrawList*> a_common, b_common;
    for (const ImDrawList* k : a)
      if (std::find(b.begin(), b.end(), k) != b.end()) a_common.push_back(k);
    for (const ImDrawList* k : b)
      if (std::find(a.begin(), a.end(), k) != a.end()) b_common.push_back(k);
    if (a_common != b_common) full = true;
  }
  if (!full) {
    for (const List& n : now) {
      const auto it = std::find_if(m_prev.begin(), m_prev.end(), [&](const List& p) { return p.key == n.key; });
      if (it == m_prev.end()) {
        dirty.push_back(n.bbox);  // a window (tooltip, popup) appeared
        continue;
      }
      const List& o = *it;
      bool same_cmds = o.cmds.size() == n.cmds.size();
      for (size_t k = 0; same_cmds && k < n.cmds.size(); ++k)
        same_cmds = std::memcmp(&o.cmds[k].clip, &n.cmds[k].clip, sizeof(ImVec4)) == 0 &&
                    o.cmds[k].texture == n.cmds[k].texture && o.cmds[k].vtx_offset == n.cmds[k].vtx_offset;
      if (!same_cmds) {
        dirty.push_back(unite(o.bbox, n.bbox));
        continue;
      }
      // the vertices that differ: [front, size - back) in each
      const size_t no = o.vtx.size(), nn = n.vtx.size();
      size_t front = 0;
      while (front < no && front < nn && same_vertex(o.vtx[front], n.vtx[front])) ++front;
      if (front == no && front == nn) {
        if (o.idx != n.idx) dirty.push_back(unite(o.bbox, n.bbox));
        continue;
      }
      size_t back = 0;
      while (back < no - front && back < nn - front && same_vertex(o.vtx[no - 1 - back], n.vtx[nn - 1 - back])) ++back;
      add_triangles(o, static_cast<unsigned int>(front), static_cast<unsigned int>(no - back), dirty);
      add_triangles(n, static_cast<unsigned int>(front), static_cast<unsigned int>(nn - back), dirty);
      // removed or added vertices change the indices after them: triangles whose indices moved
      // but whose vertices did not cover the same pixels, so nothing more is dirty
    }
    for (const List& o : m_prev)
      if (std::none_of(now.begin(), now.end(), [&](const List& n) { return n.key == o.key; }))
        dirty.push_back(o.bbox);  // a window went away
  }
  m_prev = std::move(now);
  m_size = dd.DisplaySize;
  m_valid = true;
  if (full) return {};
  // clip to the display
  std::vector<DirtyRect> out;
  for (DirtyRect r : dirty) {
    r.x0 = std::max(r.x0, dd.DisplayPos.x);
    r.y0 = std::max(r.y0, dd.DisplayPos.y);
    r.x1 = std::min(r.x1, dd.DisplayPos.x + dd.DisplaySize.x);
    r.y1 = std::min(r.y1, dd.DisplayPos.y + dd.DisplaySize.y);
    if (r.x1 > r.x0 && r.y1 > r.y0) out.push_back(r);
  }
  return merge(std::move(out), kMaxRects);
}

}  // namespace viz
