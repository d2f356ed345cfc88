// dtlab lesson: lessons from the terminal (lessons/README.md).
//   dtlab lesson list                       id, title, minutes, requirements (and broken files)
//   dtlab lesson show ID|FILE               the question and the choices, nothing revealed
//   dtlab lesson check [FILE...]            lint: every problem as file:line:col (exit 2)
//   dtlab lesson run ID|FILE [--answers K=V,...|auto] [--confidence K=N,...] [--out DIR]
//                    [--prepared [DIR]] [--part ID]
//       asks for the predictions (or takes --answers), runs, shows what to observe with measured
//       values, the predictions against the measurements, every check and the explanation;
//       writes the run directories and record.json. Exit 0 when every check holds (a wrong
//       prediction is not a failure), 8 when a check fails, 77 when a requirement is missing.
//   dtlab lesson report DIR... [--csv FILE]  per-choice rates and a CSV of learners' records
//   dtlab lesson prepare ID|FILE [--out DIR] runs the lesson's runs ahead of class
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

struct LessonCommandOptions {
  std::string lesson;                 // id or file
  std::vector<std::string> files;     // check
  std::vector<std::string> dirs;      // report
  std::string answers;                // run: K=V,... or auto
  std::string confidence;             // run: K=N,...
  std::string why;                    // run: K=text,...
  std::string out_dir;                // run, prepare
  std::string prepared;               // run: replay a prepared folder ("default": the lesson's own)
  std::string part;                   // run: one part (main or a variation id)
  std::string csv = "lesson-report.csv";
  bool include_auto = false;          // report: also records answered automatically (tests)
  bool teacher = false;               // show: teacher notes too
  bool overwrite = false;             // run, prepare: replace an earlier folder of this lesson in --out
  std::string mutation;               // mutate: only this [[mutation]] (default: every one)
};

// Adds `lesson` and its subcommands to app; returns the `lesson` subcommand.
CLI::App* add_lesson_command(CLI::App& app, LessonCommandOptions& o);
// Runs whichever lesson subcommand was parsed; returns the exit code. Throws lab::Error.
int run_lesson_command(CLI::App& lesson_cmd, LessonCommandOptions& o);
