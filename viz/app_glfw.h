// GlfwWindow: the lab window's platform layer, the only file pair that touches GLFW and OpenGL.
// It opens a window with an OpenGL 3.3 context, starts Dear ImGui's GLFW and OpenGL3 backends,
// paces frames, and reads the finished frame back for PNG screenshots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <imgui.h>

#include "damage.h"

struct GLFWwindow;

namespace viz {

// The colour behind every window. Tiled windows draw no background of their own (the app's
// choice, see app.cpp): the clear is nearly free, a full-window blended fill is not on Mesa's
// software renderer.
constexpr float kClearColor[3] = {0.11f, 0.11f, 0.12f};

class GlfwWindow {
 public:
  GlfwWindow() = default;
  ~GlfwWindow();
  GlfwWindow(const GlfwWindow&) = delete;
  GlfwWindow& operator=(const GlfwWindow&) = delete;

  // The primary monitor's content scale (1 on a 96-dpi screen, 2 on most HiDPI ones). Call
  // after init().
  float monitor_scale() const;
  // glfwInit; "" or why not (no display, ...).
  std::string init();
  // Creates the window (width x height logical pixels times `scale`, at most the monitor's work
  // area), the GL context, the ImGui context and its backends. "" or the error.
  std::string open(const char* title, int width, int height, float scale);

  bool should_close() const;
  // Waits for input or until `seconds` passed (0: just polls).
  void wait_events(double seconds);
  bool iconified() const;
  // ignore_mouse: scripted screenshots, where Xvfb's pointer (mid-screen) must not hover anything
  void new_frame(bool ignore_mouse);
  // Renders ImGui's draw data into the back buffer (no swap yet: a screenshot reads it first).
  // Returns false, drawing nothing, when the frame would equal the one on screen (unless force):
  // then do not swap either. With a software renderer only the changed rectangles are drawn
  // (DamageTracker); force draws everything.
  bool render(bool force);
  bool partial_redraw() const { return m_partial; }
  // Pixels drawn by the last render() (the window's pixels for a whole frame).
  double drawn_pixels() const { return m_drawn_pixels; }
  void swap();
  // The back buffer as a PNG (rows flipped: OpenGL's origin is bottom-left). "" or the error.
  std::string save_png(const std::string& path) const;
  std::string renderer() const;  // GL_RENDERER, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
  // Key presses (and repeats) since the last call, as GLFW key codes with their modifiers. Dear
  // ImGui 1.86 sees only which keys are down when a frame starts, so a tap whose press and release
  // arrive between two frames would be lost to it; shortcuts read this queue instead.
  struct KeyPress {
    int key = 0, mods = 0;
    bool repeat = false;  // the key is held down
  };
  std::vector<KeyPress> take_key_presses();
  void framebuffer_size(int& w, int& h) const;

 private:
  void draw_all(int w, int h);
  void draw_rects(const std::vector<DirtyRect>& rects, int w, int h);
  int count_differences_from_full(int w, int h);  // DTLAB_VERIFY_REDRAW

  GLFWwindow* m_window = nullptr;
  bool m_glfw = false, m_imgui = false;
  bool m_software = false;    // Mesa's llvmpipe or softpipe: the CPU draws every pixel
  bool m_partial = false;     // draw only damage (the back buffer survives a swap)
  bool m_verify = false;      // compare every partial frame with a full one (tests)
  bool m_refresh = true;      // the window system lost the picture: draw everything
  int m_fb_w = 0, m_fb_h = 0;
  double m_drawn_pixels = 0;
  DamageTracker m_damage;
  struct Scratch {  // draw_rects' buffers, kept between frames
    std::vector<ImVector<ImDrawIdx>> idx;
    std::vector<ImVector<ImDrawCmd>> cmds;
    std::vector<ImVector<ImDrawVert>> vtx;
    std::vector<std::vector<ImDrawIdx>> kept;
    std::vector<int> remap;
    std::vector<uint32_t> grid;
  } m_scratch;
  std::vector<KeyPress> m_keys;
};

}  // namespace viz
