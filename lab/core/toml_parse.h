// TOML as dtlab reads it (config.toml, lesson files): toml++ with exceptions, behind a check of the
// text for what Debian 12's toml++ 3.3.0 cannot be given safely. Found by fuzzing (fuzz/):
//   - assertion failures, which abort dtlab: a table header starting with a character no key can
//     start with ("[`a]", "[[[1]]]"; marzer/tomlplusplus#301), and a '}' or a control character
//     where an array expects a value ("[}", "[\v");
//   - undefined behaviour (__builtin_unreachable): some non-ASCII characters (U+00A1..U+0499,
//     U+2C5E..U+2FFF, U+3001..U+3057, U+FB26..U+FEFE) where toml++ looks for whitespace: in keys and
//     unquoted values, and right after a backslash in a """ string (tomlplusplus#190, #295).
// The check refuses those with a toml::parse_error at their line and column, like any other
// syntax error. TOML allows no non-ASCII or control character outside strings and comments and no
// such header or bracket, so only the backslash case refuses valid TOML.
#pragma once

#include <string>
#include <string_view>

#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

namespace lab {

// toml::parse(text, path), the check first. Throws toml::parse_error.
toml::table parse_toml(std::string_view text, const std::string& path);
// toml::parse_file(path), the check first. Throws toml::parse_error (also when unreadable).
toml::table parse_toml_file(const std::string& path);

// The check alone: "" when toml++ may parse the text, else what is wrong, with its 1-based line
// and column (in characters).
std::string toml_text_problem(std::string_view text, int& line, int& column);

}  // namespace lab
