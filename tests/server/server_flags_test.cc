// The server's command line: Abseil flags, --flagfile, and the exit codes of the program.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/config/flags.h"
#include "tests/support/spawn_server.h"

namespace gpucompute {
namespace {

using Outcome = ParsedCommandLine::Outcome;

class ServerFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gpucompute_flags_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(ServerFlagsTest, DefaultsAreTheServerOptionsDefaults) {
  const ParsedCommandLine parsed = ParseServerCommandLine({});
  ASSERT_EQ(parsed.outcome, Outcome::kRun) << parsed.error;
  const ServerOptions defaults;
  EXPECT_EQ(parsed.options.listen, defaults.listen);
  EXPECT_EQ(parsed.options.backend, defaults.backend);
  EXPECT_EQ(parsed.options.memory_limit_bytes, defaults.memory_limit_bytes);
  EXPECT_EQ(parsed.options.cpu_threads, defaults.cpu_threads);
  EXPECT_EQ(parsed.options.max_streams, defaults.max_streams);
  EXPECT_EQ(parsed.options.graph_min_ops, defaults.graph_min_ops);
  EXPECT_EQ(parsed.options.shutdown_grace, defaults.shutdown_grace);
  EXPECT_EQ(parsed.options.lane_spin, std::nullopt);  // chosen from the CPUs at start
  EXPECT_EQ(parsed.options.default_device, defaults.default_device);
  EXPECT_EQ(parsed.options.pool_initial_bytes, defaults.pool_initial_bytes);
  EXPECT_EQ(parsed.options.pool_release_threshold_bytes, defaults.pool_release_threshold_bytes);
  EXPECT_EQ(parsed.options.kernel_cache_dir, defaults.kernel_cache_dir);
  EXPECT_EQ(parsed.options.cuda_module, defaults.cuda_module);
  EXPECT_EQ(parsed.options.metrics_listen, defaults.metrics_listen);
  EXPECT_EQ(parsed.options.default_result_ttl_seconds, defaults.default_result_ttl_seconds);
  EXPECT_EQ(parsed.options.persist_dir, defaults.persist_dir);
  EXPECT_EQ(parsed.options.snapshot_interval, defaults.snapshot_interval);
  EXPECT_EQ(parsed.options.tls_cert_file, "");
  EXPECT_EQ(parsed.options.tls_key_file, "");
  EXPECT_EQ(parsed.options.tls_client_ca_file, "");
  EXPECT_EQ(parsed.options.tokens_file, "");
  EXPECT_FALSE(parsed.options.allow_insecure_remote);
  // The request limits: their ceilings, but 2^40 elements.
  const RequestLimits& limits = parsed.options.limits;
  EXPECT_EQ(limits.max_message_bytes, defaults.limits.max_message_bytes);
  EXPECT_EQ(limits.max_message_bytes, uint64_t{64} << 20);
  EXPECT_EQ(limits.max_dimensions, 8u);
  EXPECT_EQ(limits.max_elements, defaults.limits.max_elements);
  EXPECT_EQ(limits.max_elements, uint64_t{1} << 40);
  EXPECT_EQ(limits.max_expression_bytes, 65536u);
  EXPECT_EQ(limits.max_expression_depth, 256u);
}

TEST_F(ServerFlagsTest, EveryFlagInBothSpellings) {
  const ParsedCommandLine parsed = ParseServerCommandLine({
      "--backend=cpu",
      "--listen",
      "0.0.0.0:7000",
      "--memory-limit=512MiB",
      "--cpu_threads=3",
      "--max-streams=99",
      "--graph_min_ops=16",
      "--shutdown-grace=1.5s",
      "--lane-spin=2ms",
      "--default-device",
      "1",
      "--pool-initial=1GiB",
      "--pool-release-threshold=64MiB",
      "--kernel-cache-dir=/tmp/k",
      "--cuda-module=/opt/m.so",
      "--metrics-listen=127.0.0.1:9100",
      "--default-result-ttl=90.5",
      "--persist_dir",
      "/var/lib/gpucompute",
      "--snapshot-interval=5m",
      "--tls-cert=/etc/s.pem",
      "--tls_key",
      "/etc/s.key",
      "--tls-client-ca=/etc/ca.pem",
      "--tokens-file=/etc/tokens",
      "--allow-insecure-remote",
      "--quota-file=/etc/quotas",
      "--max-message-bytes=8MiB",
      "--max_dimensions=4",
      "--max-elements",
      "1000",
      "--max-expression-bytes=1KiB",
      "--max-expression-depth=16",
  });
  ASSERT_EQ(parsed.outcome, Outcome::kRun) << parsed.error;
  const ServerOptions& o = parsed.options;
  EXPECT_EQ(o.backend, "cpu");
  EXPECT_EQ(o.listen, "0.0.0.0:7000");
  EXPECT_EQ(o.memory_limit_bytes, 512ull << 20);
  EXPECT_EQ(o.cpu_threads, 3);
  EXPECT_EQ(o.max_streams, 99u);
  EXPECT_EQ(o.graph_min_ops, 16u);
  EXPECT_EQ(o.shutdown_grace, absl::Milliseconds(1500));
  EXPECT_EQ(o.lane_spin, absl::Milliseconds(2));
  EXPECT_EQ(o.default_device, 1);
  EXPECT_EQ(o.pool_initial_bytes, 1ull << 30);
  EXPECT_EQ(o.pool_release_threshold_bytes, 64ull << 20);
  EXPECT_EQ(o.kernel_cache_dir, std::optional<std::string>("/tmp/k"));
  EXPECT_EQ(o.cuda_module, "/opt/m.so");
  EXPECT_EQ(o.metrics_listen, "127.0.0.1:9100");
  EXPECT_EQ(o.default_result_ttl_seconds, 90.5);
  EXPECT_EQ(o.persist_dir, "/var/lib/gpucompute");
  EXPECT_EQ(o.snapshot_interval, absl::Minutes(5));
  EXPECT_EQ(o.tls_cert_file, "/etc/s.pem");
  EXPECT_EQ(o.tls_key_file, "/etc/s.key");
  EXPECT_EQ(o.tls_client_ca_file, "/etc/ca.pem");
  EXPECT_EQ(o.tokens_file, "/etc/tokens");
  EXPECT_TRUE(o.allow_insecure_remote);
  EXPECT_EQ(o.quota_file, "/etc/quotas");
  EXPECT_EQ(o.limits.max_message_bytes, 8ull << 20);
  EXPECT_EQ(o.limits.max_chunk_bytes(), (8ull << 20) - (64ull << 10));
  EXPECT_EQ(o.limits.max_dimensions, 4u);
  EXPECT_EQ(o.limits.max_elements, 1000u);
  EXPECT_EQ(o.limits.max_expression_bytes, 1024u);
  EXPECT_EQ(o.limits.max_expression_depth, 16u);
}

TEST_F(ServerFlagsTest, RequestLimitsAcceptTheEndsOfTheirRanges) {
  ParsedCommandLine parsed = ParseServerCommandLine(
      {"--max-message-bytes=4160KiB", "--max-dimensions=1", "--max-elements=1",
       "--max-expression-bytes=1", "--max-expression-depth=1"});
  ASSERT_EQ(parsed.outcome, Outcome::kRun) << parsed.error;
  EXPECT_EQ(parsed.options.limits.max_message_bytes, 4259840u);
  EXPECT_EQ(parsed.options.limits.max_chunk_bytes(), 4194304u);
  parsed = ParseServerCommandLine({"--max-message-bytes=64MiB", "--max-dimensions=8",
                                   "--max-elements=281474976710656", "--max-expression-bytes=64KiB",
                                   "--max-expression-depth=256"});
  ASSERT_EQ(parsed.outcome, Outcome::kRun) << parsed.error;
  EXPECT_EQ(parsed.options.limits.max_elements, uint64_t{1} << 48);
}

TEST_F(ServerFlagsTest, SpecialValues) {
  ParsedCommandLine parsed =
      ParseServerCommandLine({"--pool-release-threshold=keep", "--kernel-cache-dir=none"});
  ASSERT_EQ(parsed.outcome, Outcome::kRun) << parsed.error;
  EXPECT_EQ(parsed.options.pool_release_threshold_bytes, UINT64_MAX);
  EXPECT_EQ(parsed.options.kernel_cache_dir, std::optional<std::string>(""));

  parsed = ParseServerCommandLine({"--pool-release-threshold=0", "--kernel-cache-dir="});
  ASSERT_EQ(parsed.outcome, Outcome::kRun) << parsed.error;
  EXPECT_EQ(parsed.options.pool_release_threshold_bytes, 0u);
  EXPECT_EQ(parsed.options.kernel_cache_dir, std::optional<std::string>(""));
}

TEST_F(ServerFlagsTest, EachParseStartsFromTheDefaults) {
  ASSERT_EQ(ParseServerCommandLine({"--memory-limit=1GiB"}).outcome, Outcome::kRun);
  const ParsedCommandLine parsed = ParseServerCommandLine({});
  EXPECT_EQ(parsed.options.memory_limit_bytes, 0u);
}

// Sizes read as common/byte_size.h says, the reading the CLI shares: K, M, G are powers
// of 1000, Ki, Mi, Gi (with or without B) powers of 1024.
TEST_F(ServerFlagsTest, SizesAreKubernetesQuantities) {
  struct Case {
    const char* flag;
    uint64_t bytes;
  };
  for (const Case& c : {Case{"--memory-limit=1G", 1000000000},
                        Case{"--memory-limit=1GB", 1000000000},
                        Case{"--memory-limit=1gb", 1000000000},
                        Case{"--memory-limit=1Gi", uint64_t{1} << 30},
                        Case{"--memory-limit=1GiB", uint64_t{1} << 30},
                        Case{"--memory-limit=512M", 512000000},
                        Case{"--memory-limit=512Mi", uint64_t{512} << 20},
                        Case{"--memory-limit=1.5GiB", uint64_t{3} << 29},
                        Case{"--memory-limit=1.5GB", 1500000000},
                        Case{"--memory-limit=4096", 4096}}) {
    const ParsedCommandLine parsed = ParseServerCommandLine({c.flag});
    ASSERT_EQ(parsed.outcome, Outcome::kRun) << c.flag << ": " << parsed.error;
    EXPECT_EQ(parsed.options.memory_limit_bytes, c.bytes) << c.flag;
  }
  const ParsedCommandLine pool = ParseServerCommandLine(
      {"--pool-initial=2G", "--pool-release-threshold=64Mi", "--max-message-bytes=8M"});
  ASSERT_EQ(pool.outcome, Outcome::kRun) << pool.error;
  EXPECT_EQ(pool.options.pool_initial_bytes, 2000000000u);
  EXPECT_EQ(pool.options.pool_release_threshold_bytes, uint64_t{64} << 20);
  EXPECT_EQ(pool.options.limits.max_message_bytes, 8000000u);

  const struct {
    const char* flag;
    const char* message;
  } bad[] = {
      {"--memory-limit=1.5", "--memory-limit: '1.5' is not a byte size: it is not a whole number"},
      {"--memory-limit=-1G", "--memory-limit: '-1G' is not a byte size: it is negative"},
      {"--memory-limit=", "--memory-limit: '' is not a byte size: it is empty"},
      {"--memory-limit=20000000T", "--memory-limit: '20000000T' is too large"},
      {"--memory-limit=1Gb2", "--memory-limit: '1Gb2' has an unknown unit 'Gb2'"},
  };
  for (const auto& b : bad) {
    const ParsedCommandLine parsed = ParseServerCommandLine({b.flag});
    EXPECT_EQ(parsed.outcome, Outcome::kError) << b.flag;
    EXPECT_NE(parsed.error.find(b.message), std::string::npos) << b.flag << ": " << parsed.error;
  }
}

TEST_F(ServerFlagsTest, MalformedValuesSayWhatIsWrong) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"--memory-limit=lots"}, "--memory-limit: 'lots' is not a byte size"},
      {{"--memory-limit=5XB"}, "--memory-limit: '5XB' has an unknown unit"},
      {{"--cpu-threads=-1"}, "--cpu-threads: needs a non-negative integer"},
      {{"--default-device=one"}, "--default-device: needs a non-negative integer"},
      {{"--max-streams=0"}, "--max-streams: needs a positive integer"},
      {{"--shutdown-grace=-1s"}, "--shutdown-grace: must not be negative"},
      {{"--shutdown-grace=soon"}, "--shutdown-grace: "},
      {{"--lane-spin=-1us"}, "--lane-spin: must not be negative"},
      {{"--lane-spin=warm"}, "--lane-spin: "},
      {{"--pool-release-threshold=some"}, "(or 'keep')"},
      {{"--default-result-ttl=-1"}, "--default-result-ttl: needs a non-negative number"},
      {{"--default-result-ttl=2592001"}, "--default-result-ttl: at most 2592000 seconds"},
      {{"--default-result-ttl=inf"}, "--default-result-ttl: at most"},
      {{"--snapshot-interval=-1s"}, "--snapshot-interval: must not be negative"},
      {{"--max-message-bytes=1MiB"},
       "--max-message-bytes: must be from 4259840 to 67108864, not 1048576"},
      {{"--max-message-bytes=65MiB"}, "--max-message-bytes: must be from 4259840 to 67108864, "},
      {{"--max-message-bytes=big"}, "--max-message-bytes: 'big' is not a byte size"},
      {{"--max-dimensions=0"}, "--max-dimensions: must be from 1 to 8, not 0"},
      {{"--max-dimensions=9"}, "--max-dimensions: must be from 1 to 8, not 9"},
      {{"--max-dimensions=-1"}, "--max-dimensions: needs a non-negative integer"},
      {{"--max-elements=0"}, "--max-elements: must be from 1 to 281474976710656, not 0"},
      {{"--max-elements=281474976710657"}, "--max-elements: must be from 1 to 281474976710656"},
      {{"--max-elements=-5"}, "--max-elements: needs a non-negative integer"},
      {{"--max-elements=1e6"}, "--max-elements: needs a non-negative integer"},
      {{"--max-expression-bytes=0"}, "--max-expression-bytes: must be from 1 to 65536, not 0"},
      {{"--max-expression-bytes=65537"}, "--max-expression-bytes: must be from 1 to 65536"},
      {{"--max-expression-depth=0"}, "--max-expression-depth: must be from 1 to 256, not 0"},
      {{"--max-expression-depth=257"}, "--max-expression-depth: must be from 1 to 256, not 257"},
      {{"--no-such-flag=1"}, "unknown flag --no-such-flag"},
      {{"--listen"}, "--listen needs a value"},
      {{"listen=1"}, "unexpected argument 'listen=1'"},
      {{"--flagfile=/nonexistent/flags"}, "--flagfile: cannot read /nonexistent/flags"},
  };
  for (const Case& c : cases) {
    const ParsedCommandLine parsed = ParseServerCommandLine(c.args);
    EXPECT_EQ(parsed.outcome, Outcome::kError) << c.args[0];
    EXPECT_NE(parsed.error.find(c.message), std::string::npos) << c.args[0] << ": " << parsed.error;
  }
}

TEST_F(ServerFlagsTest, FlagfileIsReadInPlaceAndLaterFlagsWin) {
  const std::string inner = WriteFile("inner.flags", "--cpu-threads=7\n");
  const std::string flags = WriteFile("server.flags",
                                      "# a configuration\n\n"
                                      "--backend=cpu\n"
                                      "  --memory-limit=2GiB  \n"
                                      "--flagfile=" +
                                          inner + "\n");
  const ParsedCommandLine parsed =
      ParseServerCommandLine({"--memory-limit=1GiB", "--flagfile=" + flags, "--cpu-threads=2"});
  ASSERT_EQ(parsed.outcome, Outcome::kRun) << parsed.error;
  EXPECT_EQ(parsed.options.backend, "cpu");
  EXPECT_EQ(parsed.options.memory_limit_bytes, 2ull << 30) << "the flagfile came later";
  EXPECT_EQ(parsed.options.cpu_threads, 2) << "the command line came later";
}

TEST_F(ServerFlagsTest, FlagfileErrorsNameTheFileAndSelfInclusionEnds) {
  const std::string bad = WriteFile("bad.flags", "--memory-limit=nope\n");
  ParsedCommandLine parsed = ParseServerCommandLine({"--flagfile", bad});
  ASSERT_EQ(parsed.outcome, Outcome::kError);
  EXPECT_NE(parsed.error.find("(in " + bad + ")"), std::string::npos) << parsed.error;

  const std::string loop = (dir_ / "loop.flags").string();
  WriteFile("loop.flags", "--flagfile=" + loop + "\n");
  parsed = ParseServerCommandLine({"--flagfile=" + loop});
  ASSERT_EQ(parsed.outcome, Outcome::kError);
  EXPECT_NE(parsed.error.find("nests too deeply"), std::string::npos) << parsed.error;
}

TEST_F(ServerFlagsTest, HelpListsEveryFlag) {
  const ParsedCommandLine parsed = ParseServerCommandLine({"--cpu-threads=bad", "--help"});
  EXPECT_EQ(parsed.outcome, Outcome::kHelp);
  for (const char* flag :
       {"--backend=auto|cpu|cuda", "--listen=HOST:PORT", "--memory-limit=SIZE", "--cpu-threads=N",
        "--max-streams=N", "--shutdown-grace=DURATION", "--default-device=N", "--pool-initial=SIZE",
        "--pool-release-threshold=SIZE|keep", "--kernel-cache-dir=DIR", "--cuda-module=PATH",
        "--metrics-listen=HOST:PORT", "--default-result-ttl=SECONDS", "--persist-dir=DIR",
        "--snapshot-interval=DURATION", "--flagfile=PATH", "(default 127.0.0.1:50051)",
        "--tls-cert=PATH", "--tls-key=PATH", "--tls-client-ca=PATH", "--tokens-file=PATH",
        "--allow-insecure-remote=true|false", "SIGHUP re-reads --tokens-file",
        "--quota-file=PATH", "--max-message-bytes=SIZE", "--max-dimensions=N",
        "--max-elements=N", "--max-expression-bytes=SIZE", "--max-expression-depth=N"}) {
    EXPECT_NE(parsed.usage.find(flag), std::string::npos) << flag;
  }
  EXPECT_NE(parsed.usage.find("--graph-min-ops=N"), std::string::npos);
  for (absl::string_view line : absl::StrSplit(parsed.usage, '\n')) {
    EXPECT_LE(line.size(), 80u) << line;
  }
}

// The program itself: exit 2 and the message for a malformed value, 0 for --help, and a
// server configured by a flagfile alone.
struct Exit {
  int code = -1;
  std::string err;
};

Exit RunServer(const std::vector<std::string>& flags, const std::string& log,
               bool stop_once_listening = false) {
  const pid_t pid = testing::SpawnProgram(GPUCOMPUTE_SERVER_BIN, flags, log);
  if (pid < 0) return {};
  auto read_log = [&] {
    std::stringstream text;
    text << std::ifstream(log).rdbuf();
    return text.str();
  };
  if (stop_once_listening) {
    for (const absl::Time deadline = absl::Now() + absl::Seconds(30);
         absl::Now() < deadline && read_log().find("listening on port") == std::string::npos;) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    kill(pid, SIGTERM);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_log()};
}

TEST_F(ServerFlagsTest, ProgramExitCodes) {
  const std::string log = (dir_ / "server.log").string();
  Exit bad = RunServer({"--memory-limit=lots"}, log);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("gpucompute-server: --memory-limit: 'lots' is not a byte size"),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("usage: gpucompute-server"), std::string::npos) << bad.err;

  EXPECT_EQ(RunServer({"--bogus"}, log).code, 2);
  Exit bad_limit = RunServer({"--max-dimensions=9"}, log);
  EXPECT_EQ(bad_limit.code, 2);
  EXPECT_NE(bad_limit.err.find("gpucompute-server: --max-dimensions: must be from 1 to 8, not 9"),
            std::string::npos)
      << bad_limit.err;
  EXPECT_EQ(RunServer({"--help"}, log).code, 0);

  const std::string flags = WriteFile(
      "cpu.flags", "--backend=cpu\n--listen=127.0.0.1:0\n--memory-limit=64MiB\n--cpu-threads=1\n");
  Exit served = RunServer({"--flagfile=" + flags}, log, /*stop_once_listening=*/true);
  EXPECT_EQ(served.code, 0) << served.err;
  EXPECT_NE(served.err.find("cpu backend, listening on port"), std::string::npos) << served.err;
  // A malformed quota file is a startup error (exit 1) that names its line.
  const std::string quotas = WriteFile("quotas", "default buffers=many\n");
  Exit bad_quotas = RunServer(
      {"--listen=127.0.0.1:0", "--backend=cpu", "--cpu-threads=1", "--quota-file=" + quotas}, log);
  EXPECT_EQ(bad_quotas.code, 1) << bad_quotas.err;
  EXPECT_NE(bad_quotas.err.find("line 1: buffers needs a non-negative integer, not 'many'"),
            std::string::npos)
      << bad_quotas.err;
}

}  // namespace
}  // namespace gpucompute
