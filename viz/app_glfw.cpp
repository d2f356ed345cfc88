#include "app_glfw.h"

#include <algorithm>
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

// Clears each rectangle and draws what falls into it, in the usual order: inside the rectangle
// the result is the full frame's, outside it the previous frame's pixels stay. For each rectangle
// every command is clipped to it and keeps only the triangles that reach into it (llvmpipe would
// otherwise set up every triangle of the window once per rectangle).
void GlfwWindow::draw_rects(const std::vector<DirtyRect>& rects, int w, int h) {
  ImDrawData* dd = ImGui::GetDrawData();
  const ImVec2 off = dd->DisplayPos, scale = dd->FramebufferScale;
  m_drawn_pixels = 0;
  std::vector<ImVector<ImDrawIdx>> saved_idx(static_cast<size_t>(dd->CmdListsCount));
  std::vector<ImVector<ImDrawCmd>> saved_cmds(static_cast<size_t>(dd->CmdListsCount));
  for (const DirtyRect& r : rects) {
    // whole framebuffer pixels, rounded outwards
    const float x0 = std::floor(r.x0), y0 = std::floor(r.y0), x1 = std::ceil(r.x1), y1 = std::ceil(r.y1);
    const int fx0 = static_cast<int>((x0 - off.x) * scale.x), fy0 = static_cast<int>((y0 - off.y) * scale.y);
    const int fx1 = static_cast<int>((x1 - off.x) * scale.x), fy1 = static_cast<int>((y1 - off.y) * scale.y);
    glEnable(GL_SCISSOR_TEST);
    glScissor(fx0, h - fy1, fx1 - fx0, fy1 - fy0);
    glClear(GL_COLOR_BUFFER_BIT);
    for (int i = 0; i < dd->CmdListsCount; ++i) {
      ImDrawList* l = dd->CmdLists[i];
      saved_idx[static_cast<size_t>(i)].swap(l->IdxBuffer);
      saved_cmds[static_cast<size_t>(i)].swap(l->CmdBuffer);
      const ImVector<ImDrawIdx>& idx = saved_idx[static_cast<size_t>(i)];
      for (const ImDrawCmd& c : saved_cmds[static_cast<size_t>(i)]) {
        if (c.UserCallback) {
          l->CmdBuffer.push_back(c);
          continue;
        }
        const ImVec4 clip(std::max(c.ClipRect.x, x0), std::max(c.ClipRect.y, y0), std::min(c.ClipRect.z, x1),
                          std::min(c.ClipRect.w, y1));
        if (clip.z <= clip.x || clip.w <= clip.y) continue;
        ImDrawCmd k = c;
        k.ClipRect = clip;
        k.IdxOffset = static_cast<unsigned int>(l->IdxBuffer.Size);
        for (unsigned int t = 0; t + 2 < c.ElemCount; t += 3) {
          const ImDrawVert& a = l->VtxBuffer[static_cast<int>(c.VtxOffset + idx[static_cast<int>(c.IdxOffset + t)])];
          const ImDrawVert& b = l->VtxBuffer[static_cast<int>(c.VtxOffset + idx[static_cast<int>(c.IdxOffset + t + 1)])];
          const ImDrawVert& v = l->VtxBuffer[static_cast<int>(c.VtxOffset + idx[static_cast<int>(c.IdxOffset + t + 2)])];
          if (std::max({a.pos.x, b.pos.x, v.pos.x}) < clip.x || std::min({a.pos.x, b.pos.x, v.pos.x}) > clip.z ||
              std::max({a.pos.y, b.pos.y, v.pos.y}) < clip.y || std::min({a.pos.y, b.pos.y, v.pos.y}) > clip.w)
            continue;
          for (unsigned int e = 0; e < 3; ++e) l->IdxBuffer.push_back(idx[static_cast<int>(c.IdxOffset + t + e)]);
        }
        k.ElemCount = static_cast<unsigned int>(l->IdxBuffer.Size) - k.IdxOffset;
        if (k.ElemCount) l->CmdBuffer.push_back(k);
      }
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
      saved_idx[static_cast<size_t>(i)].resize(0);
      saved_cmds[static_cast<size_t>(i)].resize(0);
    }
    m_drawn_pixels += static_cast<double>(fx1 - fx0) * (fy1 - fy0);
  }
  glDisable(GL_SCISSOR_TEST);
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
