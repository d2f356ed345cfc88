// Where the lab window keeps its files (viz/data/paths.h) and the check of its layout file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "paths.h"
#include "test_util.h"

TEST(VizPaths, ConfigDirFollowsXdgThenHome) {
  const char* old_xdg = std::getenv("XDG_CONFIG_HOME");
  const std::string saved = old_xdg ? old_xdg : "";
  setenv("XDG_CONFIG_HOME", "/tmp/xdg-test", 1);
  EXPECT_EQ(viz::config_dir(), "/tmp/xdg-test/dtlab");
  unsetenv("XDG_CONFIG_HOME");
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(viz::config_dir(), std::string(home) + "/.config/dtlab");
  }
  if (old_xdg) setenv("XDG_CONFIG_HOME", saved.c_str(), 1);
}

TEST(VizPaths, LayoutFileCheck) {
  EXPECT_EQ(viz::check_layout_ini(""), "");
  EXPECT_EQ(viz::check_layout_ini("[Window][Views]\nPos=360,19\nSize=1240,640\nCollapsed=0\n\n[Table][0x1,2]\n"), "");
  EXPECT_NE(viz::check_layout_ini("garbage\n"), "");
  EXPECT_NE(viz::check_layout_ini("[Window][Views]\nPos 360 19\n"), "");
  EXPECT_NE(viz::check_layout_ini("[Window][A]\nPos=1,2\n\x01\x02\x03"), "");
  EXPECT_NE(viz::check_layout_ini("[Window\nPos=1,2\n"), "");
}
