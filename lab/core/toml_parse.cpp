// The check of toml_parse.h: a small scanner that knows TOML's strings, comments and brackets well
// enough to find table headers and the characters outside strings, and nothing more (toml++ does
// the parsing). It errs on the side of letting text through: what it cannot place, toml++ refuses.
#include "toml_parse.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace lab {

namespace {

bool is_bare_key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// The code point starting at s[i] (UTF-8) and its length in bytes; a malformed sequence reads as
// one byte (toml++ reports it).
char32_t decode(std::string_view s, size_t i, size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
  if (i + len > s.size()) len = 1;
  if (len == 1) return b;
  char32_t c = b & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto cont = static_cast<unsigned char>(s[i + k]);
    if ((cont & 0xC0) != 0x80) {
      len = 1;
      return b;
    }
    c = (c << 6) | (cont & 0x3F);
  }
  return c;
}

// Where toml++ 3.3.0's is_non_ascii_horizontal_whitespace() reaches TOML_UNREACHABLE (its table has
// no entry for these blocks of 1018 code points).
bool unclassifiable(char32_t c) {
  return (c >= 0xA1 && c <= 0x499) || (c >= 0x2C5E && c <= 0x2FFF) || (c >= 0x3001 && c <= 0x3057) ||
         (c >= 0xFB26 && c <= 0xFEFE);
}

class Scanner {
 public:
  explicit Scanner(std::string_view s) : m_s(s) {}

  std::string run(int& line, int& column) {
    size_t i = 0;
    if (m_s.substr(0, 3) == "\xEF\xBB\xBF") i = 3;  // a UTF-8 byte order mark, which toml++ skips
    std::string open;         // the '[' and '{' of values not closed yet
    bool line_start = true;   // only spaces and tabs so far on this line
    char prev = '\n';         // the last character outside strings and comments, spaces aside
    bool value = false;       // after the '=' of a key/value line, or inside brackets
    while (i < m_s.size() && m_problem.empty()) {
      const char c = m_s[i];
      if (c == '\n') {
        newline(i);
        line_start = true;
        prev = '\n';
        value = !open.empty();
        continue;
      }
      if (c == ' ' || c == '\t' || c == '\r') {
        advance(i, 1);
        continue;
      }
      const bool at_line_start = line_start;
      line_start = false;
      // Where a key or value starts, a quote opens a string and a bracket an array or inline table
      // (a."b" only in keys). Anything else starts a bare key or an unquoted value, which toml++
      // reads up to a terminator, quotes and brackets included ("1.0'x", "1.[\"\"\"").
      const bool token_start = prev == '\n' || prev == '=' || prev == '[' || prev == ',' || prev == '{' ||
                               (prev == '.' && !value);
      if (c == '#') {
        while (i < m_s.size() && m_s[i] != '\n') advance(i, char_length(i));
        prev = c;
        continue;
      }
      if ((c == '"' || c == '\'') && token_start) {
        string(i);
        prev = c;
        continue;
      }
      if (c == '[' && open.empty() && at_line_start) {
        header(i);
        prev = c;
        continue;
      }
      if ((c == '[' || c == '{') && token_start) {
        open += c;
        value = true;
      } else if (c == ']' || c == '}') {
        // toml++ fails an assertion on "[}" (it takes the '}' for a value)
        if (!open.empty() && open.back() != (c == ']' ? '[' : '{'))
          fail(std::string("'") + c + "' cannot close the '" + open.back() + "' before it");
        if (!open.empty()) open.pop_back();
      } else if (c == '=') {
        value = true;
      } else if (c != ',' && c != '.') {
        bare(i, value);
        if (!m_problem.empty()) break;
        prev = m_s[i - 1];
        continue;
      }
      prev = c;
      advance(i, 1);
    }
    line = m_line;
    column = m_column;
    return m_problem;
  }

 private:
  size_t char_length(size_t i) const {
    size_t len = 0;
    decode(m_s, i, len);
    return len;
  }
  void advance(size_t& i, size_t bytes) {
    i += bytes;
    ++m_column;
  }
  void newline(size_t& i) {
    ++i;
    ++m_line;
    m_column = 1;
  }
  void fail(const std::string& problem) { m_problem = problem; }

  // A bare key (up to a character that cannot be in one) or an unquoted value (up to whitespace,
  // ']', '}', ',' or '#'): toml++ classifies each of its characters, and is given only ASCII text
  // without control characters there (TOML allows no other). Stops after at least one character.
  void bare(size_t& i, bool value) {
    do {
      const auto c = static_cast<unsigned char>(m_s[i]);
      if (c >= 0x80) {
        fail("a non-ASCII character ('" + std::string(m_s.substr(i, char_length(i))) +
             "') outside a string or comment: TOML keys and values other than strings are ASCII");
        return;
      }
      if ((c < 0x20 && c != '\t') || c == 0x7F) {
        // toml++ fails an assertion on "[\v" (it takes a vertical tab for a value)
        char code[8];
        std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(c));
        fail(std::string("a control character (") + code + ") outside a string");
        return;
      }
      advance(i, 1);
    } while (i < m_s.size() && (value ? std::string_view(" \t\r\n]},#").find(m_s[i]) == std::string_view::npos
                                      : is_bare_key_char(m_s[i])));
  }

  // "[name]" or "[[name]]" at the start of a line: toml++ needs a character that can start a key
  // after the brackets and spaces.
  void header(size_t& i) {
    advance(i, 1);
    const bool array_of_tables = i < m_s.size() && m_s[i] == '[';
    if (array_of_tables) advance(i, 1);
    while (i < m_s.size() && (m_s[i] == ' ' || m_s[i] == '\t')) advance(i, 1);
    if (i >= m_s.size()) return;
    const char c = m_s[i];
    if (c == '[' && !array_of_tables) return;  // "[ [": toml++ refuses it
    if (is_bare_key_char(c) || c == '"' || c == '\'' || c == ']') return;
    fail(std::string("a table header must start with a key name, not '") +
         std::string(m_s.substr(i, char_length(i))) + "'");
  }

  // A string of any kind, from its opening quote; stops after its closing quote, or at the end of
  // the line for an unterminated one-line string (toml++ reports it).
  void string(size_t& i) {
    const char quote = m_s[i];
    const bool multi_line = m_s.substr(i, 3) == std::string(3, quote);
    advance(i, multi_line ? 3 : 1);
    while (i < m_s.size()) {
      const char c = m_s[i];
      if (c == quote) {
        if (!multi_line) {
          advance(i, 1);
          return;
        }
        size_t run = 0;
        while (i + run < m_s.size() && m_s[i + run] == quote) ++run;
        for (size_t k = 0; k < run; ++k) advance(i, 1);
        if (run >= 3) return;  // up to two quotes before the closing three belong to the string
        continue;
      }
      if (c == '\n') {
        if (!multi_line) return;
        newline(i);
        continue;
      }
      if (c == '\\' && quote == '"') {
        advance(i, 1);
        bool line_ending = false;  // a backslash ending a line (spaces after it allowed)
        if (multi_line) {
          // toml++ skips whitespace (and a line break) after a backslash, looking at the first
          // character that is not whitespace
          while (i < m_s.size() && (m_s[i] == ' ' || m_s[i] == '\t' || m_s[i] == '\r' || m_s[i] == '\n')) {
            line_ending = true;
            if (m_s[i] == '\n') newline(i);
            else advance(i, 1);
          }
          if (i < m_s.size()) {
            size_t len = 0;
            const char32_t cp = decode(m_s, i, len);
            if (unclassifiable(cp)) {
              fail("the character '" + std::string(m_s.substr(i, len)) +
                   "' right after a backslash in a \"\"\" string: this TOML reader (toml++ 3.3) cannot read "
                   "it there; put it after another character or drop the backslash");
              return;
            }
          }
        }
        if (!line_ending && i < m_s.size() && m_s[i] != '\n') advance(i, char_length(i));  // the escaped character
        continue;
      }
      advance(i, char_length(i));
    }
  }

  std::string_view m_s;
  int m_line = 1, m_column = 1;
  std::string m_problem;
};

}  // namespace

std::string toml_text_problem(std::string_view text, int& line, int& column) {
  return Scanner(text).run(line, column);
}

toml::table parse_toml(std::string_view text, const std::string& path) {
  int line = 0, column = 0;
  const std::string problem = toml_text_problem(text, line, column);
  if (!problem.empty()) {
    const auto pos = toml::source_position{static_cast<toml::source_index>(line), static_cast<toml::source_index>(column)};
    throw toml::parse_error(problem.c_str(), pos, std::make_shared<const std::string>(path));
  }
  return toml::parse(text, path);
}

toml::table parse_toml_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return toml::parse_file(path);  // toml++'s own error for a file it cannot read
  std::ostringstream s;
  s << f.rdbuf();
  return parse_toml(s.str(), path);
}

}  // namespace lab
