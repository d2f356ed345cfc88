// Where the app keeps its files, and checks of what it reads from there.
//   layout: $XDG_CONFIG_HOME/dtlab/layout.ini, else ~/.config/dtlab/layout.ini (never the current
//   directory); fonts: DejaVu from the usual system font folders.
#pragma once

#include <string>

namespace viz {

// $XDG_CONFIG_HOME/dtlab or $HOME/.config/dtlab; empty when neither variable is set (then the
// layout is not persisted).
std::string config_dir();

// Checks text meant for ImGui::LoadIniSettingsFromMemory: only "[Type][Name]" headers,
// "key=value" lines and blank lines, printable text. Returns "" when fine, else what is wrong
// ("line 3: ..."), so a corrupt file is ignored with a warning instead of half-loaded.
std::string check_layout_ini(const std::string& text);

// Reads a whole file; false when it cannot be read.
bool read_text_file(const std::string& path, std::string& out);
// Writes via a temporary file and a rename, creating the directory; "" or the error.
std::string write_text_file_atomic(const std::string& path, const std::string& text);

// The first existing file among the usual locations of a DejaVu font ("DejaVuSans.ttf");
// empty when none is installed.
std::string find_font(const std::string& file_name);

}  // namespace viz
