// `dtlab lesson report`: a folder of learners' records (session.h) turned into what a teacher
// needs: a CSV with one row per record and prediction (nbgrader's lesson: export first), and per
// prediction the share of learners who chose each answer (Peer Instruction: revote when 35-70%
// of the first vote is right).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lessons {

struct RecordFile {
  std::string path;
  nlohmann::json record;
};

// Every record (*.json with "format": "dtlab-lesson-record") under the given files and
// directories, recursively, sorted by path. Files that are not records are skipped; a record
// that cannot be parsed is an error naming the file (lab::IoError).
std::vector<RecordFile> find_records(const std::vector<std::string>& paths);

// The CSV text: header, then one row per record and prediction.
std::string records_csv(const std::vector<RecordFile>& records);

// Per lesson and prediction: how many learners chose each answer (choices in the lesson's order,
// the right one marked), the share right, and the mean confidence of right and wrong answers.
std::string choice_rates(const std::vector<RecordFile>& records);

}  // namespace lessons
