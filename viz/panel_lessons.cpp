// Lessons: the list of lessons (a malformed one is listed with its error), then one lesson taken
// predict-first: the question and the choices; Commit locks the predictions and only then is Run
// enabled; while the runs train, the views show them (paused at the moment to observe, with a
// sentence saying what to look at); then the predictions next to what was measured, the hints
// after a wrong answer, the explanation with live numbers, every check, and the variations.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <imgui.h>
#include <imgui_stdlib.h>

#include "draw.h"
#include "panels.h"

namespace viz {

namespace {

using lessons::Choice;
using lessons::Prediction;

// Lesson text (multi-line TOML strings) reflowed to the panel's width.
void wrapped(const std::string& s) { ImGui::TextWrapped("%s", lessons::reflow(s).c_str()); }

// A framed block of text in a colour: observations, hints.
void callout(ImU32 color, const char* title, const std::string& text) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  dl->ChannelsSplit(2);
  dl->ChannelsSetCurrent(1);
  ImGui::Indent(ImGui::GetFontSize() * 0.6f);
  ImGui::Dummy(ImVec2(0, ImGui::GetFontSize() * 0.2f));
  if (title) {
    ImGui::PushFont(font(FontId::Bold));
    ImGui::PushStyleColor(ImGuiCol_Text, color);
    ImGui::TextWrapped("%s", title);
    ImGui::PopStyleColor();
    ImGui::PopFont();
  }
  wrapped(text);
  ImGui::Dummy(ImVec2(0, ImGui::GetFontSize() * 0.2f));
  ImGui::Unindent(ImGui::GetFontSize() * 0.6f);
  const ImVec2 p1(p0.x + ImGui::GetContentRegionAvail().x, ImGui::GetCursorScreenPos().y);
  dl->ChannelsSetCurrent(0);
  dl->AddRectFilled(p0, p1, with_alpha(color, 0.12f), 4.0f);
  dl->AddRect(p0, p1, with_alpha(color, 0.8f), 4.0f);
  dl->ChannelsMerge();
  ImGui::Dummy(ImVec2(0, ImGui::GetFontSize() * 0.3f));
}

std::string where_to_look(const lessons::Observe& o) {
  std::string w = "the " + o.view + " view";
  for (int i = 0; i < kViewCount; ++i)  // the name on its tab
    if (o.view == view_key(static_cast<ViewId>(i))) w = std::string("the ") + view_title(static_cast<ViewId>(i)) + " view";
  if (!o.layer.empty()) w += ", layer " + o.layer;
  if (o.channel >= 0) w += ", channel " + std::to_string(o.channel);
  if (o.step >= 0) w += ", iteration " + std::to_string(o.step);
  if (o.ring_step >= 0) w += ", ring step " + std::to_string(o.ring_step);
  return w;
}

void draw_list(LessonPanelState& st, Commands& cmd) {
  heading("Lessons");
  ImGui::TextWrapped("Each lesson asks a question you answer before anything runs. Then the lab trains, pauses "
                     "where it matters, and checks your prediction against what it measured.");
  if (!st.load_error.empty()) {
    ImGui::Spacing();
    callout(col::kError, ("Could not open " + st.load_error_file).c_str(), st.load_error);
  }
  ImGui::Separator();
  if (!st.catalog_loaded) {
    st.catalog = lessons::load_catalog();
    st.catalog_loaded = true;
  }
  if (st.catalog.empty()) ImGui::TextDisabled("No lessons found: set DTLAB_LESSONS to a folder of .toml lessons.");
  for (const lessons::CatalogEntry& c : st.catalog) {
    ImGui::PushID(c.path.c_str());
    if (c.lesson) {
      ImGui::PushFont(font(FontId::Bold));
      wrapped(c.lesson->title);
      ImGui::PopFont();
      std::string req;
      for (const std::string& r : c.lesson->requires_) req += ", requires " + r;
      ImGui::TextDisabled("%s  |  ~%g min%s", c.id.c_str(), c.lesson->minutes, req.c_str());
      ImGui::SameLine();
      if (ImGui::SmallButton("Start")) cmd.lesson_start = c.path;
      tooltip(c.lesson->question);
    } else {
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kError), "%s: cannot be used", c.id.c_str());
      ImGui::PushFont(font(FontId::Small));
      text_wrapped_colored(col::kDim, c.error);
      ImGui::PopFont();
    }
    ImGui::Spacing();
    ImGui::PopID();
  }
  if (ImGui::SmallButton("Reload the list")) st.catalog_loaded = false;
  tooltip("Read the lesson folders again (after editing a lesson file).");
}

// The current part's predictions: editable until committed, then locked.
void draw_predictions(LessonDriver& d, LessonPanelState& st, Commands& cmd) {
  const lessons::Part& part = d.part();
  lessons::Session& s = d.session();
  const bool locked = s.answered(part);
  for (const Prediction& p : part.predictions) {
    ImGui::PushID(p.id.c_str());
    ImGui::Spacing();
    ImGui::PushFont(font(FontId::Bold));
    wrapped(p.prompt);
    ImGui::PopFont();
    const lessons::Answer* a = s.answer_of(p.id);
    ImGui::BeginDisabled(locked);
    if (p.kind == "choice") {
      int& sel = st.choice.emplace(p.id, -1).first->second;
      for (size_t i = 0; i < p.choices.size(); ++i) {
        const Choice& c = p.choices[i];
        const bool chosen = a ? a->value == c.key : sel == static_cast<int>(i);
        if (ImGui::RadioButton(("##" + c.key).c_str(), chosen) && !locked) sel = static_cast<int>(i);
        ImGui::SameLine();
        wrapped(c.key + ") " + c.text);
      }
    } else {
      std::string& v = st.number[p.id];
      if (a) v = a->value;
      ImGui::SetNextItemWidth(ImGui::GetFontSize() * 8);
      ImGui::InputText("##number", &v, ImGuiInputTextFlags_CharsScientific);
      if (!p.unit.empty()) {
        ImGui::SameLine();
        ImGui::TextUnformatted(p.unit.c_str());
      }
    }
    if (p.confidence) {
      int& c = st.confidence.emplace(p.id, 3).first->second;
      if (a && a->confidence) c = a->confidence;
      ImGui::SetNextItemWidth(ImGui::GetFontSize() * 9);
      ImGui::SliderInt("how sure", &c, 1, 5, c <= 1 ? "1: guessing" : c >= 5 ? "5: sure" : "%d");
    }
    if (p.ask_why) {
      std::string& w = st.why[p.id];
      ImGui::SetNextItemWidth(-1);
      ImGui::InputTextWithHint("##why", "why? (one line, kept with your answer)", &w);
    }
    ImGui::EndDisabled();
    if (a && a->automatic) ImGui::TextDisabled("(answered automatically)");
    ImGui::PopID();
  }
  ImGui::Spacing();
  if (!locked) {
    bool complete = true;
    for (const Prediction& p : part.predictions)
      complete &= p.kind == "choice" ? st.choice[p.id] >= 0 : !st.number[p.id].empty();
    ImGui::BeginDisabled(!complete);
    if (ImGui::Button("Commit my prediction")) {
      st.commit_error.clear();
      // check every answer first, so that a bad number locks nothing
      for (const Prediction& p : part.predictions)
        if (p.kind == "numeric") {
          char* end = nullptr;
          const double x = std::strtod(st.number[p.id].c_str(), &end);
          if (!end || *end != 0 || !std::isfinite(x)) st.commit_error = "'" + st.number[p.id] + "' is not a number";
        }
      if (st.commit_error.empty()) {
        try {
          for (const Prediction& p : part.predictions) {
            const std::string value = p.kind == "choice" ? p.choices[static_cast<size_t>(st.choice[p.id])].key : st.number[p.id];
            s.answer(p.id, value, p.confidence ? st.confidence[p.id] : 0, st.why[p.id]);
          }
        } catch (const lab::Error& e) {
          st.commit_error = e.what();
        }
      }
    }
    ImGui::EndDisabled();
    tooltip(complete ? "Lock your answer. It cannot be changed afterwards: that is what makes the demonstration teach."
                     : "Choose an answer for every prediction first.");
    if (!st.commit_error.empty()) text_wrapped_colored(col::kError, st.commit_error);
  }
  ImGui::SameLine();
  ImGui::BeginDisabled(!d.can_run());
  if (ImGui::Button("\xe2\x96\xb6 Run")) cmd.lesson_run = true;
  ImGui::EndDisabled();
  tooltip(d.can_run() ? "Run the lesson's experiments: the views show them as they train."
                      : "Commit your prediction first: people who predict before they look see what matters, and "
                        "those who only watch mostly do not.");
  if (!d.can_run()) ImGui::TextDisabled("Run unlocks when your prediction is committed.");
}

void draw_results(const LessonDriver& d, const LessonPanelState& st) {
  const lessons::PartResult* r = d.result();
  if (!r) return;
  heading("Your prediction and the measurement");
  for (const lessons::PredictionResult& p : r->predictions) {
    const Prediction& pr = *p.prediction;
    const ImU32 c = p.correct ? col::kGood : col::kError;
    std::string mine = p.answer ? p.answer->value : "(none)";
    if (pr.kind == "numeric" && !pr.unit.empty()) mine += " " + pr.unit;
    ImGui::PushID(pr.id.c_str());
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(c), "%s", p.correct ? "\xe2\x9c\x94" : "\xe2\x9c\x98");  // check / cross
    ImGui::SameLine();
    wrapped(pr.prompt);
    ImGui::Indent();
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kDim), "you said %s; measured: %s", mine.c_str(), p.truth().c_str());
    if (!p.misconception.empty()) text_wrapped_colored(col::kDim, "About " + p.answer->value + ": " + lessons::reflow(p.misconception));
    if (pr.kind == "numeric")
      ImGui::TextDisabled("right within %s of the measurement",
                          pr.rtol > 0 ? fmt("%g%%", pr.rtol * 100).c_str() : fmt("%g %s", pr.atol, pr.unit.c_str()).c_str());
    ImGui::Unindent();
    ImGui::PopID();
  }
  for (const std::string& h : r->hints) callout(col::kWarn, "Hint", h);
  if (!r->observations.empty()) {
    ImGui::Spacing();
    heading("What the views showed");
    for (size_t i = 0; i < r->observations.size(); ++i) {
      ImGui::Bullet();
      wrapped(r->observations[i]);
    }
  }
  ImGui::Spacing();
  heading("Explanation");
  wrapped(r->explanation);
  ImGui::Spacing();
  const int failed = r->failed_checks(), unjudged = r->unjudged_checks();
  const int held = static_cast<int>(r->checks.size()) - failed - unjudged;
  const std::string title = unjudged ? fmt("Checks: %d of %zu hold, %d not judged (machine too busy)###checks", held,
                                           r->checks.size(), unjudged)
                                     : fmt("Checks: %d of %zu hold###checks", held, r->checks.size());
  ImGui::SetNextItemOpen(st.show_checks || failed > 0 || unjudged > 0, ImGuiCond_Appearing);
  if (ImGui::CollapsingHeader(title.c_str())) {
    for (const lessons::CheckResult& c : r->checks) {
      // a timing claim on a busy machine is neither right nor wrong here: it says why
      const ImU32 colour = !c.judged ? col::kWarn : c.passed ? col::kGood : col::kError;
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(colour), "%s", !c.judged ? "NOT JUDGED" : c.passed ? "PASS" : "FAIL");
      ImGui::SameLine();
      wrapped(c.id + ": " + (c.why.empty() ? c.that : c.why));
      if (!c.judged) text_wrapped_colored(col::kDim, c.not_judged + ". Run the lesson again when the machine is idle.");
      std::string tip = c.that;
      for (const auto& [k, v] : c.values) tip += "\n" + k + " = " + v;
      if (!c.error.empty()) tip += "\nerror: " + c.error;
      tooltip(tip);
    }
  }
  if (!d.record_path().empty()) ImGui::TextDisabled("record: %s", d.record_path().c_str());
}

void draw_lesson(LessonDriver& d, LessonPanelState& st, bool teacher, Commands& cmd) {
  const lessons::Lesson& l = d.lesson();
  if (st.part_for_drafts != d.part_index()) {
    st.choice.clear();
    st.number.clear();
    st.confidence.clear();
    st.why.clear();
    st.commit_error.clear();
    st.part_for_drafts = d.part_index();
  }
  if (ImGui::SmallButton("\xe2\x86\x90 Lessons")) cmd.lesson_close = true;
  tooltip("Back to the list of lessons (this learner's record is kept).");
  ImGui::SameLine();
  if (ImGui::SmallButton("Reset for the next learner")) cmd.lesson_reset = true;
  tooltip("Start this lesson again with empty predictions; the finished learner's record stays saved.");
  ImGui::PushFont(font(FontId::Bold));
  wrapped(l.title);
  ImGui::PopFont();
  const size_t parts = l.parts().size();
  ImGui::TextDisabled("%s v%d | ~%g min | part %zu of %zu: %s%s", l.id.c_str(), l.version, l.minutes, d.part_index() + 1, parts,
                      d.part_index() == 0 ? "the question" : "variation", d.prepared() ? " | prepared runs" : "");
  ImGui::Separator();
  if (d.part_index() == 0) {
    wrapped(l.question);
    if (!l.context.empty()) text_wrapped_colored(col::kDim, lessons::reflow(l.context));
  } else {
    heading(("Variation: " + d.part().title).c_str());
    wrapped(d.part().text);
  }
  if (d.stage() == LessonStage::Question) {
    draw_predictions(d, st, cmd);
  } else {
    // the locked predictions, compactly
    for (const Prediction& p : d.part().predictions)
      if (const lessons::Answer* a = d.session().answer_of(p.id))
        ImGui::TextDisabled("locked: %s -> %s%s", p.id.c_str(), a->value.c_str(),
                            a->confidence ? fmt(" (how sure: %d)", a->confidence).c_str() : "");
  }
  ImGui::Separator();
  switch (d.stage()) {
    case LessonStage::Question: break;
    case LessonStage::Running:
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kGood), "Running %zu of %zu", d.runs_done() + 1, d.part().runs.size());
      ImGui::PushFont(font(FontId::Small));
      text_wrapped_colored(col::kDim, d.activity());
      ImGui::PopFont();
      break;
    case LessonStage::Observing:
      if (const lessons::Observe* o = d.observing()) {
        callout(col::kEval, ("Observe: " + where_to_look(*o)).c_str(), d.observing_text());
        if (o->view == "bench") text_wrapped_colored(col::kDim, "Hover a point or a bar for its numbers; then:");
        else ImGui::TextDisabled("Step with the Right arrow, or look around; then:");
        if (ImGui::Button("Continue \xe2\x96\xb6")) cmd.lesson_continue = true;
      }
      break;
    case LessonStage::Results:
    case LessonStage::Finished:
      draw_results(d, st);
      ImGui::Spacing();
      if (d.stage() == LessonStage::Results && d.has_next_part()) {
        const lessons::Part& next = *l.parts()[d.part_index() + 1];
        if (ImGui::Button(("Next: " + next.title).c_str())) cmd.lesson_next_part = true;
      } else if (d.stage() == LessonStage::Results) {
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kGood), "Lesson done.");
      }
      break;
  }
  if (!d.error().empty()) text_wrapped_colored(col::kError, d.error());
  if (teacher && (!l.teacher.notes.empty() || !l.teacher.pitfalls.empty())) {
    ImGui::Spacing();
    if (ImGui::CollapsingHeader("Teacher notes")) {
      wrapped(l.teacher.notes);
      if (!l.teacher.expected_first_vote.empty()) text_wrapped_colored(col::kDim, "Expected first vote: " + l.teacher.expected_first_vote);
      for (const std::string& p : l.teacher.pitfalls) {
        ImGui::Bullet();
        wrapped(p);
      }
    }
  }
}

}  // namespace

void draw_lessons_panel(LessonDriver* driver, LessonPanelState& st, bool teacher, Commands& cmd) {
  if (driver) draw_lesson(*driver, st, teacher, cmd);
  else draw_list(st, cmd);
}

}  // namespace viz
