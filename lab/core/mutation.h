// Deliberately wrong behaviour, for tests only. A lesson's checks are claims about the lab; a
// mutation test ([[mutation]] in a lesson, `dtlab lesson mutate`) switches one of these on and
// shows that the checks about that behaviour then fail: a check that would pass with the lab
// wrong in the respect it names tests nothing.
//
// Off unless the environment variable DTLAB_MUTATE names it (a comma-separated list); a name
// that is not in known_mutations() is refused where DTLAB_MUTATE is read, so a typo cannot turn a
// mutation test into a run of the correct lab. Each mutation point asks mutated() at most once
// per step or per layer call, never per element.
#pragma once

#include <string>
#include <vector>

namespace lab {

struct MutationInfo {
  const char* name;
  const char* what;  // the wrong behaviour, in words
};

// Every mutation the lab knows, with what it breaks.
const std::vector<MutationInfo>& known_mutations();

// Whether DTLAB_MUTATE names `name` (which must be a known mutation). Throws ConfigError when
// DTLAB_MUTATE names an unknown one.
bool mutated(const char* name);

// DTLAB_MUTATE's names, checked: throws ConfigError naming an unknown one and the known names.
std::vector<std::string> active_mutations();

}  // namespace lab
