#include "damage.h"

#include <algorithm>
#include <cstring>

namespace viz {

namespace {

bool empty(const DirtyRect& r) { return r.x1 <= r.x0 || r.y1 <= r.y0; }

// The smallest rectangle holding both (an empty one holds nothing).
DirtyRect unite(const DirtyRect& a, const DirtyRect& b) {
  if (empty(a)) return b;
  if (empty(b)) return a;
  return {std::min(a.x0, b.x0), std::min(a.y0, b.y0), std::max(a.x1, b.x1), std::max(a.y1, b.y1)};
}

DirtyRect extend(const DirtyRect& r, const ImVec2& p) {
  return {std::min(r.x0, p.x), std::min(r.y0, p.y), std::max(r.x1, p.x), std::max(r.y1, p.y)};
}

bool near(const DirtyRect& a, const DirtyRect& b, float gap) {
  return a.x0 <= b.x1 + gap && b.x0 <= a.x1 + gap && a.y0 <= b.y1 + gap && b.y0 <= a.y1 + gap;
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

template <class T>
uint64_t hash_bytes(uint64_t h, const T& v) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  for (size_t i = 0; i + 4 <= sizeof(T); i += 4) {
    uint32_t w;
    std::memcpy(&w, b + i, 4);
    h = mix(h, w);
  }
  return h;
}

bool same(const ImDrawVert& a, const ImDrawVert& b) { return std::memcmp(&a, &b, sizeof(ImDrawVert)) == 0; }

// What a command draws in one frame: its triangles' vertices cut to its clip rectangle.
DirtyRect command_box(const DamageTracker::List& l, const DamageTracker::Cmd& cmd) {
  DirtyRect box;
  bool any = false;
  for (unsigned int k = 0; k < cmd.elems && cmd.idx_offset + k < l.idx.size(); ++k) {
    const unsigned int v = cmd.vtx_offset + l.idx[cmd.idx_offset + k];
    if (v >= l.vtx.size()) continue;
    const ImVec2 p = l.vtx[v].pos;
    box = any ? extend(box, p) : DirtyRect{p.x, p.y, p.x, p.y};
    any = true;
  }
  if (!any) return {};
  // one pixel of margin for anti-aliasing
  return {std::max(box.x0 - 1, cmd.clip.x), std::max(box.y0 - 1, cmd.clip.y), std::min(box.x1 + 1, cmd.clip.z),
          std::min(box.y1 + 1, cmd.clip.w)};
}

// What a list draws (not the union of its clip rectangles: a window draws its frame and title
// bar clipped to the whole display).
DirtyRect list_box(const DamageTracker::List& l) {
  DirtyRect box;
  for (const DamageTracker::Cmd& cmd : l.cmds) box = unite(box, command_box(l, cmd));
  return box;
}

// Marks the vertices of o and n that are not in a common run. Front and back are trimmed first;
// in between, after each difference the next anchor is searched: the first vertex of n (from
// the difference on) that also appears in o at or after the difference, followed by the same
// next vertex. Vertices carry their positions, so they are nearly always unique and the anchor
// found is the true continuation. Linear in the sizes.
void mark_changes(const std::vector<ImDrawVert>& o, const std::vector<ImDrawVert>& n, std::vector<char>& oc,
                  std::vector<char>& nc, std::vector<uint64_t>& hash, std::vector<int64_t>& head,
                  std::vector<int64_t>& next) {
  const size_t no = o.size(), nn = n.size();
  oc.assign(no, 0);
  nc.assign(nn, 0);
  size_t front = 0;
  while (front < no && front < nn && same(o[front], n[front])) ++front;
  size_t back = 0;
  while (back < no - front && back < nn - front && same(o[no - 1 - back], n[nn - 1 - back])) ++back;
  const size_t a0 = front, a1 = no - back, b0 = front, b1 = nn - back;
  auto mark = [](std::vector<char>& c, size_t from, size_t to) {
    std::fill(c.begin() + static_cast<std::ptrdiff_t>(from), c.begin() + static_cast<std::ptrdiff_t>(to), 1);
  };
  if (a0 == a1 || b0 == b1) {
    mark(oc, a0, a1);
    mark(nc, b0, b1);
    return;
  }
  auto vertex_hash = [](const ImDrawVert& v) { return hash_bytes(0, v); };
  // o's middle by hash: chains in ascending order
  size_t buckets = 16;
  while (buckets < 2 * (a1 - a0)) buckets *= 2;
  head.assign(buckets, -1);
  next.assign(a1 - a0, -1);
  for (size_t p = a1; p-- > a0;) {
    const size_t h = vertex_hash(o[p]) & (buckets - 1);
    next[p - a0] = head[h];
    head[h] = static_cast<int64_t>(p);
  }
  hash.resize(b1 - b0);
  for (size_t j = b0; j < b1; ++j) hash[j - b0] = vertex_hash(n[j]);
  auto anchor = [&](size_t i, size_t j) {  // o[i] = n[j], and the vertex after them too
    return same(o[i], n[j]) && (i + 1 >= a1 || j + 1 >= b1 || same(o[i + 1], n[j + 1]));
  };
  size_t i = a0, j = b0;
  while (i < a1 && j < b1) {
    if (same(o[i], n[j])) {
      ++i;
      ++j;
      continue;
    }
    bool found = false;
    for (size_t jj = j; jj < b1 && !found; ++jj)
      for (int64_t p = head[hash[jj - b0] & (buckets - 1)]; p >= 0; p = next[static_cast<size_t>(p) - a0]) {
        if (static_cast<size_t>(p) < i || !anchor(static_cast<size_t>(p), jj)) continue;
        mark(oc, i, static_cast<size_t>(p));
        mark(nc, j, jj);
        i = static_cast<size_t>(p);
        j = jj;
        found = true;
        break;
      }
    if (!found) break;
  }
  mark(oc, i, a1);
  mark(nc, j, b1);
}

// Bounding boxes of the triangles of l that use a changed vertex, cut to their clips (one pixel
// of margin for anti-aliasing). Triangles that follow each other and lie close together share a
// box.
void add_triangles(const DamageTracker::List& l, const std::vector<char>& changed, std::vector<DirtyRect>& out) {
  for (const DamageTracker::Cmd& cmd : l.cmds) {
    DirtyRect cur;
    for (unsigned int k = 0; k + 2 < cmd.elems && cmd.idx_offset + k + 2 < l.idx.size(); k += 3) {
      const unsigned int a = cmd.vtx_offset + l.idx[cmd.idx_offset + k];
      const unsigned int b = cmd.vtx_offset + l.idx[cmd.idx_offset + k + 1];
      const unsigned int c = cmd.vtx_offset + l.idx[cmd.idx_offset + k + 2];
      if (a >= l.vtx.size() || b >= l.vtx.size() || c >= l.vtx.size()) continue;
      if (!changed[a] && !changed[b] && !changed[c]) continue;
      DirtyRect box{l.vtx[a].pos.x, l.vtx[a].pos.y, l.vtx[a].pos.x, l.vtx[a].pos.y};
      box = extend(extend(box, l.vtx[b].pos), l.vtx[c].pos);
      box = {std::max(box.x0 - 1, cmd.clip.x), std::max(box.y0 - 1, cmd.clip.y), std::min(box.x1 + 1, cmd.clip.z),
             std::min(box.y1 + 1, cmd.clip.w)};
      if (empty(box)) continue;
      if (empty(cur) || near(cur, box, DamageTracker::kGap)) {
        cur = unite(cur, box);
      } else {
        out.push_back(cur);
        cur = box;
      }
    }
    if (!empty(cur)) out.push_back(cur);
  }
}

}  // namespace

std::vector<DirtyRect> merge_rects(std::vector<DirtyRect> r, size_t max, float gap) {
  // Neighbours first, until no two are within the gap; then the pair whose union grows least,
  // and neighbours again (a union may reach a third rectangle).
  auto merge_neighbours = [&] {
    bool changed = true;
    while (changed) {
      changed = false;
      for (size_t i = 0; i < r.size(); ++i)
        for (size_t j = i + 1; j < r.size();)
          if (near(r[i], r[j], gap)) {
            r[i] = unite(r[i], r[j]);
            r[j] = r.back();
            r.pop_back();
            changed = true;
          } else {
            ++j;
          }
    }
  };
  merge_neighbours();
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
    r[bj] = r.back();
    r.pop_back();
    merge_neighbours();
  }
  return r;
}

std::vector<DirtyRect> DamageTracker::update(const ImDrawData& dd, bool& full) {
  // this frame's lists, into buffers kept from earlier frames
  m_now.resize(static_cast<size_t>(dd.CmdListsCount));
  for (int i = 0; i < dd.CmdListsCount; ++i) {
    const ImDrawList& l = *dd.CmdLists[i];
    List& c = m_now[static_cast<size_t>(i)];
    c.key = &l;
    c.vtx.assign(l.VtxBuffer.Data, l.VtxBuffer.Data + l.VtxBuffer.Size);
    c.idx.assign(l.IdxBuffer.Data, l.IdxBuffer.Data + l.IdxBuffer.Size);
    c.cmds.clear();
    for (const ImDrawCmd& cmd : l.CmdBuffer)
      if (!cmd.UserCallback) c.cmds.push_back({cmd.ClipRect, cmd.TextureId, cmd.VtxOffset, cmd.IdxOffset, cmd.ElemCount});
  }
  std::vector<List>& now = m_now;
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
        dirty.push_back(list_box(n));  // a window (tooltip, popup) appeared
        continue;
      }
      const List& o = *it;
      if (o.cmds.size() != n.cmds.size()) {
        dirty.push_back(unite(list_box(o), list_box(n)));
        continue;
      }
      // commands drawn with another clip rectangle or texture: where they draw, in both frames
      for (size_t k = 0; k < n.cmds.size(); ++k)
        if (std::memcmp(&o.cmds[k].clip, &n.cmds[k].clip, sizeof(ImVec4)) != 0 || o.cmds[k].texture != n.cmds[k].texture ||
            o.cmds[k].vtx_offset != n.cmds[k].vtx_offset)
          dirty.push_back(unite(command_box(o, o.cmds[k]), command_box(n, n.cmds[k])));
      mark_changes(o.vtx, n.vtx, m_old_changed, m_new_changed, m_hash, m_head, m_next);
      const bool any_change = std::find(m_old_changed.begin(), m_old_changed.end(), 1) != m_old_changed.end() ||
                              std::find(m_new_changed.begin(), m_new_changed.end(), 1) != m_new_changed.end();
      if (!any_change) {
        // The same vertices: the triangles may still differ (rare; then the whole list).
        bool same_triangles = o.idx == n.idx;
        for (size_t k = 0; same_triangles && k < n.cmds.size(); ++k)
          same_triangles = o.cmds[k].idx_offset == n.cmds[k].idx_offset && o.cmds[k].elems == n.cmds[k].elems;
        if (!same_triangles) dirty.push_back(unite(list_box(o), list_box(n)));
        continue;
      }
      // A triangle whose three vertices are all unchanged covers the same pixels in both
      // frames (ImGui builds each shape's triangles from that shape's own vertices, so a shape
      // whose vertices are all the same has the same triangles).
      add_triangles(o, m_old_changed, dirty);
      add_triangles(n, m_new_changed, dirty);
    }
    for (const List& o : m_prev)
      if (std::none_of(now.begin(), now.end(), [&](const List& n) { return n.key == o.key; }))
        dirty.push_back(list_box(o));  // a window went away
  }
  std::swap(m_prev, m_now);
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
    if (!empty(r)) out.push_back(r);
  }
  return merge_rects(std::move(out), kMaxRects, kGap);
}

}  // namespace viz
