// The line-oriented configuration files the server reads (--tokens-file,
// --quota-file): one entry a line, fields separated by white space, '#' starting a
// comment.
#ifndef GPUCOMPUTE_SERVER_CONFIG_CONFIG_FILE_H_
#define GPUCOMPUTE_SERVER_CONFIG_CONFIG_FILE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gpucompute {

struct ConfigLine {
  int number = 0;  // from 1
  std::vector<absl::string_view> fields;
};

// The lines of `text` that hold fields, comments removed; the views point into `text`.
std::vector<ConfigLine> SplitConfigLines(absl::string_view text);

// The contents of `path`, or NOT_FOUND "cannot read the <what> <path>".
absl::StatusOr<std::string> ReadConfigFile(absl::string_view what, const std::string& path);

// Reads `path` and parses it with `parse`; a parse error is prefixed with "<what> <path>, ".
template <typename Table>
absl::StatusOr<Table> LoadConfigFile(absl::string_view what, const std::string& path,
                                     absl::StatusOr<Table> (*parse)(absl::string_view)) {
  absl::StatusOr<std::string> text = ReadConfigFile(what, path);
  if (!text.ok()) return text.status();
  absl::StatusOr<Table> table = parse(*text);
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ", ", table.status().message()));
  }
  return table;
}

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CONFIG_CONFIG_FILE_H_
