// Starts the gpucompute-server program (or another) as a child process for the tests
// that run the real programs.
#ifndef GPUCOMPUTE_TESTS_SUPPORT_SPAWN_SERVER_H_
#define GPUCOMPUTE_TESTS_SUPPORT_SPAWN_SERVER_H_

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char** environ;

namespace gpucompute::testing {

// Starts `program` with `flags`, its stderr going to `log` (truncated) and its stdout to
// /dev/null. Returns its pid, or -1 if it could not be started.
inline pid_t SpawnProgram(const std::string& program, const std::vector<std::string>& flags,
                          const std::string& log) {
  std::vector<std::string> args = {program};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return spawned == 0 ? pid : -1;
}

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_SUPPORT_SPAWN_SERVER_H_
