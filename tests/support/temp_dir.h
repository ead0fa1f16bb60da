// A directory of a test's own under the system's temporary directory, removed with it.
#ifndef GPUCOMPUTE_TESTS_SUPPORT_TEMP_DIR_H_
#define GPUCOMPUTE_TESTS_SUPPORT_TEMP_DIR_H_

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace gpucompute::testing {

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            absl::StrCat("gpucompute_test_", getpid(), "_", counter_++);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `text` to the file `name` in the directory (replacing it); returns its path.
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = (path_ / name).string();
    std::ofstream(path, std::ios::trunc) << text;
    return path;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_SUPPORT_TEMP_DIR_H_
