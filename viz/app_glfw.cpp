#include "app_glfw.h"

#include <algorithm>
#include <cfloat>
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
  // Frames are paced by the app (wait_events); no vsync wait inside swap, so a frame's time is
  // its work.
  glfwSwapInterval(0);
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  m_imgui = true;
  ImGui_ImplGlfw_InitForOpenGL(m_window, true);
  ImGui_ImplOpenGL3_Init("#version 330 core");
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

// FNV-1a over the draw data: vertices, indices, and each command's clip rectangle and texture.
uint64_t GlfwWindow::draw_data_hash() {
  const ImDrawData* dd = ImGui::GetDrawData();
  uint64_t h = 1469598103934665603ull;
  auto mixin = [&h](const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  if (!dd) return h;
  mixin(&dd->DisplaySize, sizeof dd->DisplaySize);
  for (int i = 0; i < dd->CmdListsCount; ++i) {
    const ImDrawList* l = dd->CmdLists[i];
    mixin(l->VtxBuffer.Data, static_cast<size_t>(l->VtxBuffer.Size) * sizeof(ImDrawVert));
    mixin(l->IdxBuffer.Data, static_cast<size_t>(l->IdxBuffer.Size) * sizeof(ImDrawIdx));
    for (const ImDrawCmd& c : l->CmdBuffer) {
      mixin(&c.ClipRect, sizeof c.ClipRect);
      mixin(&c.TextureId, sizeof c.TextureId);
      mixin(&c.ElemCount, sizeof c.ElemCount);
    }
  }
  return h;
}

bool GlfwWindow::render(bool force) {
  ImGui::Render();
  int w = 0, h = 0;
  glfwGetFramebufferSize(m_window, &w, &h);
  // A frame that would look exactly like the one on screen is not drawn again: with a software
  // renderer every pixel costs, and the ranks need the CPU.
  const uint64_t hash = draw_data_hash() ^ (static_cast<uint64_t>(w) << 32) ^ static_cast<uint64_t>(h);
  if (!force && m_have_frame && hash == m_last_hash) return false;
  m_last_hash = hash;
  m_have_frame = true;
  glViewport(0, 0, w, h);
  glClearColor(kClearColor[0], kClearColor[1], kClearColor[2], 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
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

std::string GlfwWindow::renderer() const {
  const GLubyte* r = glGetString(GL_RENDERER);
  return r ? reinterpret_cast<const char*>(r) : "?";
}

}  // namespace viz
