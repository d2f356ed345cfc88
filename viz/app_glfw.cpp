#include "app_glfw.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>
#include <stb_image_write.h>

namespace viz {

namespace {

// GLFW reports errors through a callback; the latest is kept to explain a failed init or open.
// (Process-wide by GLFW's design; written only while GLFW calls are being made on this thread.)
std::string g_glfw_error;
void on_glfw_error(int code, const char* text) { g_glfw_error = "GLFW error " + std::to_string(code) + ": " + text; }

}  // namespace

GlfwWindow::~GlfwWindow() {
  if (m_imgui) {
    ImGui_ImplOpenGL3_Shutdown();
    ImGui_ImplGlfw_Shutdown();
    ImGui::DestroyContext();
  }
  if (m_window) glfwDestroyWindow(m_window);
  if (m_glfw) glfwTerminate();
}

std::string GlfwWindow::init() {
  // Mesa's llvmpipe rasterizes on helper threads by default. While the ranks keep every core busy
  // those threads wait for a core at each flush, and frames take twice as long; rasterizing on
  // the GUI thread costs the same CPU without the waits. Only when the user has not chosen.
  setenv("LP_NUM_THREADS", "0", 0);
  glfwSetErrorCallback(on_glfw_error);
  if (!glfwInit()) return g_glfw_error.empty() ? "glfwInit failed" : g_glfw_error;
  m_glfw = true;
  return "";
}

float GlfwWindow::monitor_scale() const {
  GLFWmonitor* m = glfwGetPrimaryMonitor();
  if (!m) return 1.0f;
  float sx = 1, sy = 1;
  glfwGetMonitorContentScale(m, &sx, &sy);
  return std::max(1.0f, std::max(sx, sy));
}

std::string GlfwWindow::open(const char* title, int width, int height, float scale) {
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_SCALE_TO_MONITOR, GLFW_FALSE);  // we scale fonts and sizes ourselves
  int w = static_cast<int>(static_cast<float>(width) * scale), h = static_cast<int>(static_cast<float>(height) * scale);
  if (GLFWmonitor* m = glfwGetPrimaryMonitor()) {
    int x = 0, y = 0, ww = 0, wh = 0;
    glfwGetMonitorWorkarea(m, &x, &y, &ww, &wh);
    if (ww > 0 && wh > 0) {
      w = std::min(w, ww);
      h = std::min(h, wh);
    }
  }
  m_window = glfwCreateWindow(w, h, title, nullptr, nullptr);
  if (!m_window) return g_glfw_error.empty() ? "cannot create an OpenGL 3.3 window" : g_glfw_error;
  glfwMakeContextCurrent(m_window);
  glfwSetWindowUserPointer(m_window, this);
  glfwSetWindowRefreshCallback(m_window, [](GLFWwindow* w) {
    static_cast<GlfwWindow*>(glfwGetWindowUserPointer(w))->m_refresh = true;
  });
  // Installed before ImGui's backend, which chains to it.
  glfwSetKeyCallback(m_window, [](GLFWwindow* w, int key, int, int action, int mods) {
    if (action == GLFW_PRESS || action == GLFW_REPEAT)
      static_cast<GlfwWindow*>(glfwGetWindowUserPointer(w))->m_keys.push_back({key, mods, action == GLFW_REPEAT});
  });
  // Frames are paced by the app (wait_events); no vsync wait inside swap, so a frame's time is
  // its work.
  glfwSwapInterval(0);
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  m_imgui = true;
  ImGui_ImplGlfw_InitForOpenGL(m_window, true);
  ImGui_ImplOpenGL3_Init("#version 330 core");
  // Partial redraws need a back buffer that keeps the last frame after a swap. Mesa's software
  // rasterizers on X11 (llvmpipe, softpipe) copy it to the window and keep it; GPU drivers may
  // hand out another buffer, so they draw whole frames (cheap for them anyway). Setting
  // DTLAB_FULL_REDRAW=1 turns partial redraws off; DTLAB_VERIFY_REDRAW=1 checks each one
  // against a full redraw (the tests do).
  const std::string r = renderer();
  const char* full_env = std::getenv("DTLAB_FULL_REDRAW");
  m_software = r.find("llvmpipe") != std::string::npos || r.find("softpipe") != std::string::npos;
  m_partial = m_software && !(full_env && full_env[0] == '1');
  const char* verify_env = std::getenv("DTLAB_VERIFY_REDRAW");
  m_verify = verify_env && verify_env[0] == '1';
  return "";
}

bool GlfwWindow::should_close() const { return glfwWindowShouldClose(m_window); }

void GlfwWindow::wait_events(double seconds) {
  if (seconds > 0) glfwWaitEventsTimeout(seconds);
  else glfwPollEvents();
}

bool GlfwWindow::iconified() const { return glfwGetWindowAttrib(m_window, GLFW_ICONIFIED) != 0; }

void GlfwWindow::new_frame(bool ignore_mouse) {
  ImGui_ImplOpenGL3_NewFrame();
  ImGui_ImplGlfw_NewFrame();
  if (ignore_mouse) ImGui::GetIO().MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
  ImGui::NewFrame();
}

void GlfwWindow::draw_all(int w, int h) {
  glDisable(GL_SCISSOR_TEST);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  m_drawn_pixels = static_cast<double>(w) * h;
}

// Clears the rectangles, then draws what falls into them in one pass: every command is cut to
// each rectangle it reaches and keeps only the triangles that reach into it (llvmpipe would
// otherwise set up every triangle of the window once per rectangle). Inside the rectangles the
// result is the full frame's, outside them the previous frame's pixels stay. The rectangles
// never overlap (DamageTracker keeps them apart), so no pixel is blended twice.
//
// Which triangles reach which rectangle: a grid of kCell-pixel cells lists the rectangles over
// each cell, so a triangle (most are a glyph or a line segment, within one or two cells) is
// tested against the few rectangles near it, not all of them.
void GlfwWindow::draw_rects(const std::vector<DirtyRect>& rects, int w, int h) {
  constexpr float kCell = 32;
  ImDrawData* dd = ImGui::GetDrawData();
  const ImVec2 off = dd->DisplayPos, scale = dd->FramebufferScale;
  m_drawn_pixels = 0;
  const size_t nr = std::min<size_t>(rects.size(), 32);  // a bit each in a 32-bit mask
  // whole framebuffer pixels, rounded outwards
  std::vector<ImVec4> px(nr);
  std::vector<std::array<int, 4>> fpx(nr);  // the same in framebuffer pixels, top-down
  glEnable(GL_SCISSOR_TEST);
  for (size_t i = 0; i < nr; ++i) {
    const DirtyRect& r = rects[i];
    px[i] = ImVec4(std::floor(r.x0), std::floor(r.y0), std::ceil(r.x1), std::ceil(r.y1));
    const int fx0 = static_cast<int>((px[i].x - off.x) * scale.x), fy0 = static_cast<int>((px[i].y - off.y) * scale.y);
    const int fx1 = static_cast<int>((px[i].z - off.x) * scale.x), fy1 = static_cast<int>((px[i].w - off.y) * scale.y);
    fpx[i] = {fx0, fy0, fx1, fy1};
    glScissor(fx0, h - fy1, fx1 - fx0, fy1 - fy0);
    glClear(GL_COLOR_BUFFER_BIT);
    m_drawn_pixels += static_cast<double>(fx1 - fx0) * (fy1 - fy0);
  }
  glDisable(GL_SCISSOR_TEST);
  // the grid: a mask of the rectangles over each cell
  const int gw = std::max(1, static_cast<int>(std::ceil(dd->DisplaySize.x / kCell)));
  const int gh = std::max(1, static_cast<int>(std::ceil(dd->DisplaySize.y / kCell)));
  auto cell_x = [&](float x) { return std::clamp(static_cast<int>((x - off.x) / kCell), 0, gw - 1); };
  auto cell_y = [&](float y) { return std::clamp(static_cast<int>((y - off.y) / kCell), 0, gh - 1); };
  std::vector<uint32_t>& grid = m_scratch.grid;
  grid.assign(static_cast<size_t>(gw) * static_cast<size_t>(gh), 0);
  for (size_t i = 0; i < nr; ++i)
    for (int y = cell_y(px[i].y); y <= cell_y(px[i].w); ++y)
      for (int x = cell_x(px[i].x); x <= cell_x(px[i].z); ++x) grid[static_cast<size_t>(y * gw + x)] |= uint32_t{1} << i;

  // The lists' own index and command buffers are swapped out for scratch ones, filled with what
  // falls into the rectangles, and swapped back after drawing. Scratch buffers keep their
  // capacity from frame to frame.
  std::vector<ImVector<ImDrawIdx>>& saved_idx = m_scratch.idx;
  std::vector<ImVector<ImDrawCmd>>& saved_cmds = m_scratch.cmds;
  std::vector<ImVector<ImDrawVert>>& saved_vtx = m_scratch.vtx;
  std::vector<std::vector<ImDrawIdx>>& kept = m_scratch.kept;  // per rectangle: a command's triangles in it
  std::vector<int>& remap = m_scratch.remap;
  if (saved_idx.size() < static_cast<size_t>(dd->CmdListsCount)) {
    saved_idx.resize(static_cast<size_t>(dd->CmdListsCount));
    saved_cmds.resize(static_cast<size_t>(dd->CmdListsCount));
    saved_vtx.resize(static_cast<size_t>(dd->CmdListsCount));
  }
  kept.resize(std::max(kept.size(), nr));
  std::vector<ImVec4> clip(nr);
  std::vector<char> compacted(static_cast<size_t>(dd->CmdListsCount), 0);
  for (int i = 0; i < dd->CmdListsCount; ++i) {
    ImDrawList* l = dd->CmdLists[i];
    saved_idx[static_cast<size_t>(i)].swap(l->IdxBuffer);
    saved_cmds[static_cast<size_t>(i)].swap(l->CmdBuffer);
    l->IdxBuffer.resize(0);
    l->CmdBuffer.resize(0);
    const ImVector<ImDrawIdx>& idx = saved_idx[static_cast<size_t>(i)];
    // Only the vertices of kept triangles are uploaded (a frame keeps a small part of the
    // window's): renumbered from 0 in a compact buffer. Not for lists past 16-bit indices.
    ImVector<ImDrawVert>& compact = saved_vtx[static_cast<size_t>(i)];
    const bool compacting = sizeof(ImDrawIdx) > 2 || l->VtxBuffer.Size <= 0xFFFF;
    if (compacting) {
      compact.resize(0);
      remap.assign(static_cast<size_t>(l->VtxBuffer.Size), -1);
    }
    for (const ImDrawCmd& c : saved_cmds[static_cast<size_t>(i)]) {
      if (c.UserCallback) {
        l->CmdBuffer.push_back(c);
        continue;
      }
      // The pixels the backend's scissor gives this command in a full frame: it truncates the
      // origin and the size separately, so the clip is cut to whole pixels the same way here,
      // or a partial frame would draw a column more or less at a fractional edge.
      const ImVec2 cmin((c.ClipRect.x - off.x) * scale.x, (c.ClipRect.y - off.y) * scale.y);
      const ImVec2 cmax((c.ClipRect.z - off.x) * scale.x, (c.ClipRect.w - off.y) * scale.y);
      if (cmax.x <= cmin.x || cmax.y <= cmin.y) continue;
      const int sx0 = static_cast<int>(cmin.x), sx1 = sx0 + static_cast<int>(cmax.x - cmin.x);
      const int sy1 = h - static_cast<int>(static_cast<float>(h) - cmax.y), sy0 = sy1 - static_cast<int>(cmax.y - cmin.y);
      uint32_t reach = 0;  // rectangles this command's clip rectangle meets
      for (size_t r = 0; r < nr; ++r) {
        kept[r].clear();
        const int x0 = std::max(sx0, fpx[r][0]), y0 = std::max(sy0, fpx[r][1]);
        const int x1 = std::min(sx1, fpx[r][2]), y1 = std::min(sy1, fpx[r][3]);
        if (x0 >= x1 || y0 >= y1) continue;
        clip[r] = ImVec4(static_cast<float>(x0) / scale.x + off.x, static_cast<float>(y0) / scale.y + off.y,
                         static_cast<float>(x1) / scale.x + off.x, static_cast<float>(y1) / scale.y + off.y);
        reach |= uint32_t{1} << r;
      }
      if (!reach) continue;
      for (unsigned int t = 0; t + 2 < c.ElemCount; t += 3) {
        const ImDrawIdx* tri = &idx[static_cast<int>(c.IdxOffset + t)];
        const ImVec2 a = l->VtxBuffer[static_cast<int>(c.VtxOffset + tri[0])].pos;
        const ImVec2 b = l->VtxBuffer[static_cast<int>(c.VtxOffset + tri[1])].pos;
        const ImVec2 v = l->VtxBuffer[static_cast<int>(c.VtxOffset + tri[2])].pos;
        const float x0 = std::min({a.x, b.x, v.x}), x1 = std::max({a.x, b.x, v.x});
        const float y0 = std::min({a.y, b.y, v.y}), y1 = std::max({a.y, b.y, v.y});
        uint32_t near = 0;
        for (int y = cell_y(y0); y <= cell_y(y1); ++y)
          for (int x = cell_x(x0); x <= cell_x(x1); ++x) near |= grid[static_cast<size_t>(y * gw + x)];
        near &= reach;
        for (uint32_t m = near; m; m &= m - 1) {
          const size_t r = static_cast<size_t>(__builtin_ctz(m));
          if (x1 < clip[r].x || x0 > clip[r].z || y1 < clip[r].y || y0 > clip[r].w) continue;
          kept[r].insert(kept[r].end(), tri, tri + 3);
        }
      }
      for (size_t r = 0; r < nr; ++r) {
        if (kept[r].empty()) continue;
        ImDrawCmd k = c;
        k.ClipRect = clip[r];
        k.IdxOffset = static_cast<unsigned int>(l->IdxBuffer.Size);
        k.ElemCount = static_cast<unsigned int>(kept[r].size());
        if (compacting) {
          k.VtxOffset = 0;
          for (ImDrawIdx e : kept[r]) {
            const size_t v = c.VtxOffset + e;
            if (remap[v] < 0) {
              remap[v] = compact.Size;
              compact.push_back(l->VtxBuffer[static_cast<int>(v)]);
            }
            l->IdxBuffer.push_back(static_cast<ImDrawIdx>(remap[v]));
          }
        } else {
          for (ImDrawIdx e : kept[r]) l->IdxBuffer.push_back(e);
        }
        l->CmdBuffer.push_back(k);
      }
    }
    if (compacting) l->VtxBuffer.swap(compact);
    compacted[static_cast<size_t>(i)] = compacting;
    if (l->CmdBuffer.empty()) {
      ImDrawCmd none;  // the backend expects at least one command per list
      none.ClipRect = ImVec4(0, 0, 0, 0);
      l->CmdBuffer.push_back(none);
    }
  }
  ImGui_ImplOpenGL3_RenderDrawData(dd);
  for (int i = 0; i < dd->CmdListsCount; ++i) {
    ImDrawList* l = dd->CmdLists[i];
    l->IdxBuffer.swap(saved_idx[static_cast<size_t>(i)]);
    l->CmdBuffer.swap(saved_cmds[static_cast<size_t>(i)]);
    if (compacted[static_cast<size_t>(i)]) l->VtxBuffer.swap(saved_vtx[static_cast<size_t>(i)]);
  }
  (void)w;
}

int GlfwWindow::count_differences_from_full(int w, int h) {
  std::vector<unsigned char> partial(static_cast<size_t>(w) * h * 3), full(partial.size());
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, w, h, GL_RGB, GL_UNSIGNED_BYTE, partial.data());
  draw_all(w, h);
  glReadPixels(0, 0, w, h, GL_RGB, GL_UNSIGNED_BYTE, full.data());
  int diff = 0;
  for (size_t i = 0; i < full.size(); i += 3) diff += std::memcmp(&full[i], &partial[i], 3) != 0;
  return diff;
}

bool GlfwWindow::render(bool force) {
  ImGui::Render();
  int w = 0, h = 0;
  glfwGetFramebufferSize(m_window, &w, &h);
  bool full = false;
  const std::vector<DirtyRect> rects = m_damage.update(*ImGui::GetDrawData(), full);
  const bool unchanged = !full && rects.empty();
  if (w != m_fb_w || h != m_fb_h || m_refresh || force || !m_partial) full = true;
  const bool must = w != m_fb_w || h != m_fb_h || m_refresh || force;
  m_fb_w = w;
  m_fb_h = h;
  if (unchanged && !must) {
    // Nothing changed. Without partial redraws the tracker still tells us so: skip the frame.
    m_drawn_pixels = 0;
    return false;
  }
  glViewport(0, 0, w, h);
  glClearColor(kClearColor[0], kClearColor[1], kClearColor[2], 1.0f);
  if (full) {
    draw_all(w, h);
  } else {
    draw_rects(rects, w, h);
    if (m_verify) {
      const double drawn = m_drawn_pixels;
      const int diff = count_differences_from_full(w, h);
      m_drawn_pixels = drawn;
      if (diff) std::fprintf(stderr, "dtlab gui: partial redraw differs from a full one in %d pixels\n", diff);
    }
  }
  m_refresh = false;
  // Software rasterizers draw at the next flush: finish here, so that render() is the drawing
  // and swap() the presenting (frame statistics tell them apart). No cost: the pixels have to be
  // drawn before the swap anyway, on this thread (LP_NUM_THREADS=0, see init()).
  if (m_software) glFinish();
  return true;
}

void GlfwWindow::swap() { glfwSwapBuffers(m_window); }

void GlfwWindow::framebuffer_size(int& w, int& h) const { glfwGetFramebufferSize(m_window, &w, &h); }

std::string GlfwWindow::save_png(const std::string& path) const {
  int w = 0, h = 0;
  glfwGetFramebufferSize(m_window, &w, &h);
  if (w <= 0 || h <= 0) return "the window has no pixels (minimized?)";
  std::vector<unsigned char> px(static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  glReadBuffer(GL_BACK);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadPixels(0, 0, w, h, GL_RGB, GL_UNSIGNED_BYTE, px.data());
  if (glGetError() != GL_NO_ERROR) return "glReadPixels failed";
  const size_t row = static_cast<size_t>(w) * 3;
  std::vector<unsigned char> flipped(px.size());
  for (int y = 0; y < h; ++y)
    std::copy(px.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(h - 1 - y) * row),
              px.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(h - y) * row),
              flipped.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(y) * row));
  if (!stbi_write_png(path.c_str(), w, h, 3, flipped.data(), static_cast<int>(row)))
    return "cannot write " + path;
  return "";
}

std::vector<GlfwWindow::KeyPress> GlfwWindow::take_key_presses() {
  std::vector<KeyPress> out;
  out.swap(m_keys);
  return out;
}

std::string GlfwWindow::renderer() const {
  const GLubyte* r = glGetString(GL_RENDERER);
  return r ? reinterpret_cast<const char*>(r) : "?";
}

}  // namespace viz
