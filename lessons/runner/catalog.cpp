#include "catalog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "errors.h"
#include "session.h"

namespace lessons {

namespace fs = std::filesystem;

namespace {

std::string exe_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return fs::path(buf).parent_path().string();
}

bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

}  // namespace

std::vector<std::string> lesson_dirs() {
  std::vector<std::string> out;
  auto add = [&](const std::string& d) {
    if (d.empty() || !is_dir(d)) return;
    std::error_code ec;
    const std::string canon = fs::weakly_canonical(d, ec).string();
    if (std::find(out.begin(), out.end(), canon) == out.end()) out.push_back(canon);
  };
  if (const char* env = std::getenv("DTLAB_LESSONS"); env && env[0]) {
    std::stringstream s(env);
    std::string d;
    while (std::getline(s, d, ':')) add(d);
    return out;
  }
#ifdef DTLAB_SOURCE_LESSONS_DIR
  add(DTLAB_SOURCE_LESSONS_DIR);
#endif
  const std::string exe = exe_dir();
  if (!exe.empty()) {
    add(exe + "/../lessons");
    add(exe + "/../share/dtlab/lessons");
  }
  return out;
}

std::vector<CatalogEntry> load_catalog() {
  std::vector<CatalogEntry> out;
  std::set<std::string> ids;
  for (const std::string& d : lesson_dirs()) {
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".toml") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      CatalogEntry c;
      c.path = f.string();
      c.id = f.stem().string();
      if (!ids.insert(c.id).second) continue;
      try {
        c.lesson = load_lesson(c.path);
      } catch (const std::exception& e) {
        c.error = e.what();
      }
      out.push_back(std::move(c));
    }
  }
  std::sort(out.begin(), out.end(), [](const CatalogEntry& a, const CatalogEntry& b) { return a.id < b.id; });
  return out;
}

std::string resolve_lesson(const std::string& id_or_file) {
  std::error_code ec;
  if (id_or_file.find('/') != std::string::npos || (id_or_file.size() > 5 && id_or_file.compare(id_or_file.size() - 5, 5, ".toml") == 0)) {
    if (!fs::is_regular_file(id_or_file, ec)) throw lab::IoError("lesson file " + id_or_file + " does not exist");
    return id_or_file;
  }
  std::string known;
  for (const std::string& d : lesson_dirs()) {
    const std::string p = d + "/" + id_or_file + ".toml";
    if (fs::is_regular_file(p, ec)) return p;
  }
  for (const CatalogEntry& c : load_catalog()) known += (known.empty() ? "" : ", ") + c.id;
  std::string dirs;
  for (const std::string& d : lesson_dirs()) dirs += (dirs.empty() ? "" : ":") + d;
  throw lab::ConfigError("no lesson '" + id_or_file + "'" + (known.empty() ? "" : " (lessons: " + known + ")"),
                         dirs.empty() ? "no lesson directory found: set DTLAB_LESSONS to a directory of .toml lessons"
                                      : "lessons are read from " + dirs + " (DTLAB_LESSONS overrides)");
}

std::string user_data_dir() {
  if (const char* x = std::getenv("XDG_DATA_HOME"); x && x[0] == '/') return std::string(x) + "/dtlab";
  if (const char* h = std::getenv("HOME"); h && h[0]) return std::string(h) + "/.local/share/dtlab";
  return "/tmp/dtlab-" + std::to_string(getuid());
}

std::string prepared_dir(const std::string& id) { return user_data_dir() + "/lessons/prepared/" + id; }

std::string records_dir() { return user_data_dir() + "/lessons/records"; }

std::string new_session_dir(const std::string& id) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  const std::string base = user_data_dir() + "/lessons/runs/" + id + "-" + buf;
  std::string dir = base;
  std::error_code ec;
  for (int n = 2; fs::exists(dir, ec); ++n) dir = base + "-" + std::to_string(n);
  return dir;
}

void prepare_lesson_dir(const std::string& dir, const Lesson& lesson, bool overwrite, const std::string& flag) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  if (!fs::is_directory(dir, ec)) throw lab::IoError(flag + " " + dir + " exists and is not a folder");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  if (names.empty()) return;
  const auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  std::string kind;  // what the folder holds, from its own files
  for (const char* f : {"prepared.json", "record.json", kLessonDirMarker}) {
    if (!has(f)) continue;
    const std::string file = f;
    try {
      std::ifstream in(dir + "/" + file);
      const nlohmann::json j = nlohmann::json::parse(in);
      const std::string id = j.contains("lesson") && j["lesson"].is_object() ? j["lesson"].value("id", "")
                                                                               : j.value("lesson", "");
      const std::string when = j.value(file == "prepared.json" ? "prepared" : file == "record.json" ? "finished" : "started", "");
      // the marker alone: the session or preparation that made the folder never finished
      const std::string what = file == "prepared.json"  ? "the prepared runs"
                               : file == "record.json" ? "a session"
                               : "an unfinished " + std::string(j.value("what", "") == "prepare" ? "preparation" : "session");
      kind = what + " of lesson '" + id + "'" + (when.empty() ? "" : " (" + std::string(file == kLessonDirMarker ? "started " : "") + when + ")");
      if (id != lesson.id)
        throw lab::IoError(flag + " " + dir + " holds " + kind + ", not of '" + lesson.id + "'",
                           "choose a new or empty folder for " + flag);
    } catch (const nlohmann::json::exception&) {
      kind = "a lesson folder with an unreadable " + std::string(f);
    }
    break;
  }
  if (kind.empty()) {
    std::string examples;
    for (size_t i = 0; i < names.size() && i < 3; ++i) examples += (i ? ", " : "") + names[i];
    throw lab::IoError(flag + " " + dir + " is not empty and is not a lesson folder: it holds " + examples +
                           (names.size() > 3 ? ", ..." : ""),
                       "choose a new or empty folder for " + flag + " (dtlab never deletes files it did not write)");
  }
  if (!overwrite)
    throw lab::IoError(flag + " " + dir + " already holds " + kind + ": dtlab does not replace it unasked",
                       "choose a new " + flag + ", or pass --overwrite to replace it");
  std::vector<std::string> ours = {"record.json", "prepared.json", kLessonDirMarker};
  for (const Part* p : lesson.parts())
    for (const RunSpec& r : p->runs) ours.push_back(r.name);
  for (const std::string& n : ours) {
    fs::remove_all(dir + "/" + n, ec);
    if (ec) throw lab::IoError("--overwrite: cannot remove " + dir + "/" + n + ": " + ec.message());
  }
}

void mark_lesson_dir(const std::string& dir, const Lesson& lesson, const std::string& what) {
  const std::string path = dir + "/" + kLessonDirMarker;
  std::ofstream out(path);
  out << nlohmann::json{{"format", "dtlab-lesson-folder"}, {"lesson", lesson.id}, {"version", lesson.version},
                        {"what", what}, {"started", iso_now()}}.dump(1)
      << "\n";
  if (!out) throw lab::IoError("cannot write " + path);
}

std::string learner_name() {
  for (const char* v : {"DTLAB_LEARNER", "USER", "LOGNAME"})
    if (const char* x = std::getenv(v); x && x[0]) return x;
  return "learner";
}

}  // namespace lessons
