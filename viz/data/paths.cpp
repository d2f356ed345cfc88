#include "paths.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace viz {

namespace fs = std::filesystem;

std::string config_dir() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/dtlab";
  const char* home = std::getenv("HOME");
  if (home && home[0]) return std::string(home) + "/.config/dtlab";
  return "";
}

std::string check_layout_ini(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  bool any_header = false;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    for (unsigned char ch : line)
      if (ch < 0x20 && ch != '\t') return "line " + std::to_string(n) + ": control characters (binary data?)";
    if (line.empty()) continue;
    if (line[0] == '[') {
      // [Type][Name]
      const size_t close = line.find(']');
      if (close == std::string::npos || close + 1 >= line.size() || line[close + 1] != '[' || line.back() != ']')
        return "line " + std::to_string(n) + ": a section header must look like [Window][Name]";
      any_header = true;
      continue;
    }
    if (!any_header) return "line " + std::to_string(n) + ": settings before the first [Window][Name] header";
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) return "line " + std::to_string(n) + ": expected key=value";
  }
  return "";
}

bool read_text_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  out = s.str();
  return true;
}

std::string write_text_file_atomic(const std::string& path, const std::string& text) {
  std::error_code ec;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (ec) return "cannot create " + p.parent_path().string() + ": " + ec.message();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) return "cannot write " + tmp;
  }
  fs::rename(tmp, path, ec);
  if (ec) return "cannot replace " + path + ": " + ec.message();
  return "";
}

std::string find_font(const std::string& file_name) {
  // Debian/Ubuntu, Fedora, Arch, and a user's own font folder.
  std::vector<std::string> dirs = {"/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu-sans-fonts",
                                   "/usr/share/fonts/dejavu", "/usr/share/fonts/TTF",
                                   "/usr/local/share/fonts"};
  if (const char* home = std::getenv("HOME")) dirs.push_back(std::string(home) + "/.local/share/fonts");
  for (const std::string& d : dirs) {
    const std::string f = d + "/" + file_name;
    std::error_code ec;
    if (fs::is_regular_file(f, ec)) return f;
  }
  return "";
}

}  // namespace viz
