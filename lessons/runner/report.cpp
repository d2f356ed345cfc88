#include "report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "errors.h"

namespace lessons {

namespace fs = std::filesystem;

namespace {

void consider(const fs::path& p, std::vector<RecordFile>& out) {
  if (p.extension() != ".json") return;
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  const std::string text = s.str();
  if (text.find("dtlab-lesson-record") == std::string::npos) return;  // not a record: skip quietly
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw lab::IoError(p.string() + ": a lesson record that is not valid JSON (" + e.what() + ")",
                       "remove or repair the file; the other records are fine");
  }
  if (!j.is_object() || j.value("format", "") != "dtlab-lesson-record") return;
  if (!j.contains("lesson") || !j.contains("parts") || !j["parts"].is_array())
    throw lab::IoError(p.string() + ": a lesson record without lesson or parts", "remove or repair the file");
  out.push_back({p.string(), std::move(j)});
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string text_of(const nlohmann::json& j) {
  if (j.is_null()) return "";
  if (j.is_string()) return j.get<std::string>();
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  return j.dump();
}

}  // namespace

std::vector<RecordFile> find_records(const std::vector<std::string>& paths) {
  std::vector<RecordFile> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) {
      consider(p, out);
    } else if (fs::is_directory(p, ec)) {
      for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec)) consider(it->path(), out);
    } else {
      throw lab::IoError("dtlab lesson report: " + p + " does not exist", "give folders or files of lesson records");
    }
  }
  std::sort(out.begin(), out.end(), [](const RecordFile& a, const RecordFile& b) { return a.path < b.path; });
  return out;
}

std::string records_csv(const std::vector<RecordFile>& records) {
  std::ostringstream o;
  o << "record,learner,lesson,lesson_version,front_end,answers,finished,part,prediction,kind,answer,confidence,correct,"
       "truth,why\n";
  for (const RecordFile& r : records) {
    const nlohmann::json& j = r.record;
    for (const auto& part : j["parts"]) {
      if (!part.contains("predictions")) continue;
      for (const auto& p : part["predictions"]) {
        o << csv_field(r.path) << "," << csv_field(text_of(j.value("learner", nlohmann::json()))) << ","
          << csv_field(text_of(j["lesson"].value("id", nlohmann::json()))) << "," << text_of(j["lesson"].value("version", nlohmann::json()))
          << "," << csv_field(text_of(j.value("front_end", nlohmann::json()))) << ","
          << csv_field(text_of(j.value("answers", nlohmann::json()))) << "," << csv_field(text_of(j.value("finished", nlohmann::json())))
          << "," << csv_field(text_of(part.value("part", nlohmann::json()))) << "," << csv_field(text_of(p.value("id", nlohmann::json())))
          << "," << csv_field(text_of(p.value("kind", nlohmann::json()))) << "," << csv_field(text_of(p.value("answer", nlohmann::json())))
          << "," << text_of(p.value("confidence", nlohmann::json())) << "," << text_of(p.value("correct", nlohmann::json())) << ","
          << csv_field(text_of(p.value("truth", nlohmann::json()))) << "," << csv_field(text_of(p.value("why", nlohmann::json())))
          << "\n";
      }
    }
  }
  return o.str();
}

std::string choice_rates(const std::vector<RecordFile>& records) {
  struct Tally {
    std::string lesson, title, prompt, kind, truth;
    int version = 0;
    std::vector<std::pair<std::string, std::string>> choices;  // key, text (lesson order)
    std::vector<std::string> right;
    std::map<std::string, int> counts;
    int n = 0, correct = 0;
    double conf_right = 0, conf_wrong = 0;
    int conf_right_n = 0, conf_wrong_n = 0;
  };
  std::vector<std::string> order;
  std::map<std::string, Tally> tallies;
  for (const RecordFile& r : records) {
    const nlohmann::json& j = r.record;
    const std::string lesson = text_of(j["lesson"].value("id", nlohmann::json()));
    for (const auto& part : j["parts"])
      for (const auto& p : part.value("predictions", nlohmann::json::array())) {
        if (p.value("answer", nlohmann::json()).is_null()) continue;
        const std::string key = lesson + "/" + text_of(p.value("id", nlohmann::json()));
        if (!tallies.count(key)) order.push_back(key);
        Tally& t = tallies[key];
        t.lesson = lesson;
        t.title = text_of(j["lesson"].value("title", nlohmann::json()));
        t.version = j["lesson"].value("version", 0);
        t.prompt = text_of(p.value("prompt", nlohmann::json()));
        t.kind = text_of(p.value("kind", nlohmann::json()));
        t.truth = text_of(p.value("truth", nlohmann::json()));
        if (t.choices.empty() && p.contains("choices"))
          for (const auto& c : p["choices"]) t.choices.push_back({text_of(c.value("key", nlohmann::json())), text_of(c.value("text", nlohmann::json()))});
        if (p.contains("right_choices")) t.right = p["right_choices"].get<std::vector<std::string>>();
        const std::string answer = text_of(p["answer"]);
        ++t.counts[answer];
        ++t.n;
        const bool ok = p.value("correct", false);
        t.correct += ok ? 1 : 0;
        const int conf = p.value("confidence", 0);
        if (conf > 0) {
          (ok ? t.conf_right : t.conf_wrong) += conf;
          ++(ok ? t.conf_right_n : t.conf_wrong_n);
        }
      }
  }
  std::ostringstream o;
  char buf[512];
  std::string last_lesson;
  for (const std::string& key : order) {
    const Tally& t = tallies[key];
    if (t.lesson != last_lesson) {
      o << (last_lesson.empty() ? "" : "\n") << t.lesson << " (v" << t.version << "): " << t.title << "\n";
      last_lesson = t.lesson;
    }
    o << "  " << key.substr(key.find('/') + 1) << ": " << t.prompt << "\n";
    if (t.kind == "choice") {
      std::vector<std::pair<std::string, std::string>> rows = t.choices;
      for (const auto& count : t.counts) {
        const std::string& answer = count.first;  // not a structured binding: C++17 lambdas cannot capture one (clang)
        if (std::none_of(rows.begin(), rows.end(), [&](const auto& r) { return r.first == answer; })) rows.push_back({answer, ""});
      }
      for (const auto& [k, text] : rows) {
        const int c = t.counts.count(k) ? t.counts.at(k) : 0;
        const bool right = std::find(t.right.begin(), t.right.end(), k) != t.right.end();
        std::snprintf(buf, sizeof buf, "    %s %-3s %3d of %-3d %5.1f%%  %s\n", right ? "*" : " ", k.c_str(), c, t.n,
                      t.n ? 100.0 * c / t.n : 0.0, text.substr(0, 70).c_str());
        o << buf;
      }
    } else {
      std::snprintf(buf, sizeof buf, "    measured %s; %d answers\n", t.truth.c_str(), t.n);
      o << buf;
    }
    std::snprintf(buf, sizeof buf, "    right: %d of %d (%.0f%%)", t.correct, t.n, t.n ? 100.0 * t.correct / t.n : 0.0);
    o << buf;
    if (t.conf_right_n || t.conf_wrong_n) o << "; mean confidence";
    if (t.conf_right_n) {
      std::snprintf(buf, sizeof buf, " right %.1f", t.conf_right / t.conf_right_n);
      o << buf;
    }
    if (t.conf_wrong_n) {
      std::snprintf(buf, sizeof buf, "%s wrong %.1f", t.conf_right_n ? "," : "", t.conf_wrong / t.conf_wrong_n);
      o << buf;
    }
    const double share = t.n ? static_cast<double>(t.correct) / t.n : 0;
    if (t.n >= 3)
      o << (share < 0.35 ? "  -> below 35%: revisit the idea before discussing"
                         : share <= 0.7 ? "  -> 35-70%: discuss in pairs, then vote again" : "  -> above 70%: explain briefly and move on");
    o << "\n";
  }
  if (order.empty()) o << "no answered predictions in these records\n";
  return o.str();
}

}  // namespace lessons
