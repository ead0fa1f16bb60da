#include "server/config/config_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_split.h"

namespace gpucompute {

std::vector<ConfigLine> SplitConfigLines(absl::string_view text) {
  std::vector<ConfigLine> lines;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (!fields.empty()) lines.push_back(ConfigLine{number, std::move(fields)});
  }
  return lines;
}

absl::StatusOr<std::string> ReadConfigFile(absl::string_view what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace gpucompute
