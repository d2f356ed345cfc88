// Where lessons and learners' files live.
//   Lessons: every <id>.toml in the lesson directories: $DTLAB_LESSONS (a ':'-separated list) if
//   set, else the source tree's lessons/ and, beside the executable, ../lessons and
//   ../share/dtlab/lessons. A lesson id found twice is taken from the first directory.
//   Learners' files: under the XDG data directory, $XDG_DATA_HOME/dtlab (else
//   ~/.local/share/dtlab): lessons/records (one JSON record per answered lesson),
//   lessons/runs (the runs of each session), lessons/prepared/<id> (dtlab lesson prepare).
//   Never the working directory.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lesson.h"

namespace lessons {

struct CatalogEntry {
  std::string path;
  std::string id;                 // the file's stem when it could not be read
  std::optional<Lesson> lesson;   // set when it loaded
  std::string error;              // otherwise: every problem, file:line:col each
};

std::vector<std::string> lesson_dirs();
// Every lesson file of the lesson directories, sorted by id; malformed ones carry their error.
std::vector<CatalogEntry> load_catalog();
// A lesson id or a path to a .toml file -> its path. Throws lab::ConfigError naming the known ids.
std::string resolve_lesson(const std::string& id_or_file);

// $XDG_DATA_HOME/dtlab or ~/.local/share/dtlab (created on demand by the callers).
std::string user_data_dir();
// <data>/lessons/prepared/<id>
std::string prepared_dir(const std::string& id);
// A fresh session directory <data>/lessons/runs/<id>-<UTC time>[-n].
std::string new_session_dir(const std::string& id);
// A folder for a lesson's runs and record (`lesson run --out`, `lesson prepare`), by the rule of
// run directories (lab/run/run_dir.h): a new or empty folder is used; an earlier folder of this
// lesson (record.json or prepared.json) is refused, saying what it holds, unless `overwrite`,
// which removes its record, prepared.json and the lesson's run folders (nothing else); any other
// folder is refused. Throws lab::IoError (exit 4). `flag` names the option in messages.
// An interrupted session or preparation (Ctrl-C, a time limit) leaves the folder with only its
// marker, lesson.json, written when it starts: such a folder is refused as "an unfinished session
// of lesson 'x'" and --overwrite reuses it.
void prepare_lesson_dir(const std::string& dir, const Lesson& lesson, bool overwrite, const std::string& flag);
// The marker: which lesson the folder is for, `what` ("session" or "prepare") and when it started.
inline constexpr const char* kLessonDirMarker = "lesson.json";
void mark_lesson_dir(const std::string& dir, const Lesson& lesson, const std::string& what);
// <data>/lessons/records
std::string records_dir();
// Who the learner is, for records: $DTLAB_LEARNER, else $USER, else "learner".
std::string learner_name();

}  // namespace lessons
