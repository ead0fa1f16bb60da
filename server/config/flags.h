// gpucompute-server's command line: Abseil flags, parsed into ServerOptions.
//
// Flags are defined with ABSL_FLAG in flags.cc and parsed through Abseil's flag
// reflection, so every flag takes "--name=value" or "--name value", booleans also
// "--name" and "--noname", and "--flagfile=PATH" reads more flags from a file: one per
// line, blank lines and lines starting with '#' ignored (the form of a Kubernetes
// ConfigMap holding a configuration). Later flags override earlier ones.
#ifndef GPUCOMPUTE_SERVER_CONFIG_FLAGS_H_
#define GPUCOMPUTE_SERVER_CONFIG_FLAGS_H_

#include <string>
#include <vector>

#include "server/server.h"

namespace gpucompute {

struct ParsedCommandLine {
  enum class Outcome {
    kRun,    // start a server with `options`
    kHelp,   // print `usage` to stdout, exit 0
    kError,  // print `error` and `usage` to stderr, exit 2
  };
  Outcome outcome = Outcome::kRun;
  ServerOptions options;
  std::string error;
  std::string usage;
};

// Parses `args` (argv without the program name). Every call starts from the flags'
// defaults, so it can be called more than once (tests do).
ParsedCommandLine ParseServerCommandLine(const std::vector<std::string>& args);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CONFIG_FLAGS_H_
