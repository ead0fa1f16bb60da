// The gpucompute CLI against the gpucompute-server program: both started as separate
// processes, talking over a loopback socket, with .npy files in and out.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/npy.h"
#include "client/cpp/shared_memory.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "server/persistence/persist_format.h"
#include "tests/support/test_util.h"

namespace gpucompute {
namespace {

namespace v1 = ::gpucompute::v1;

// The programs under test: the build's own, unless the environment names others.
std::string Program(const char* env, const char* built) {
  const char* v = std::getenv(env);
  return v != nullptr && *v != '\0' ? v : built;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

struct Result {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// A gpucompute-server program a test started, its stderr going to `log`.
struct ServerProcess {
  pid_t pid = -1;
  std::string log;
};

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_bin_ = Program("GPUCOMPUTE_SERVER_BIN", GPUCOMPUTE_SERVER_BIN);
    cli_bin_ = Program("GPUCOMPUTE_CLI_BIN", GPUCOMPUTE_CLI_BIN);
    dir_ = std::filesystem::temp_directory_path() /
           ("gpucompute_cli_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    server_ = SpawnServer(
        {"--listen=127.0.0.1:0", "--backend=cpu", "--memory-limit=512MiB", "--cpu-threads=2"},
        (dir_ / "server.log").string());
    port_ = WaitForListening(server_);
  }

  static void TearDownTestSuite() {
    if (server_.pid > 0) StopServer(server_, SIGTERM);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Starts the server program with `flags` and returns once it runs (its exec succeeded).
  // With `block_stop_signals`, SIGINT and SIGTERM are blocked in the child before the exec
  // (a signal mask survives exec), so that a signal sent at once waits, pending, for the
  // server's own code instead of meeting the default action in the dynamic loader.
  static ServerProcess SpawnServer(const std::vector<std::string>& flags, const std::string& log,
                                   bool block_stop_signals = false) {
    return SpawnProgram(server_bin_, flags, log, block_stop_signals);
  }

  // A CPU server that allows shared memory, and its port (0 if it did not start).
  static std::pair<ServerProcess, int> SpawnSharedMemoryServer(const std::string& log) {
    ServerProcess process =
        SpawnServer({"--listen=127.0.0.1:0", "--backend=cpu", "--memory-limit=256MiB",
                     "--cpu-threads=2", "--allow-shared-memory"},
                    log);
    const int port = WaitForListening(process);
    return {process, port};
  }

  // Starts `program` with `flags`, its stderr (and stdout) going to `log`.
  static ServerProcess SpawnProgram(const std::string& program,
                                    const std::vector<std::string>& flags, const std::string& log,
                                    bool block_stop_signals = false) {
    std::vector<std::string> args = {program};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    int exec_done[2];  // closed by the exec (or by the child's exit)
    if (pipe2(exec_done, O_CLOEXEC) != 0) return {};
    const pid_t pid = fork();
    if (pid == 0) {  // only async-signal-safe calls from here to exec
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) dup2(fd, STDERR_FILENO);
      if (fd >= 0) dup2(fd, STDOUT_FILENO);
      if (block_stop_signals) sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(exec_done[1]);
    char byte;
    while (pid > 0 && read(exec_done[0], &byte, 1) < 0 && errno == EINTR) {
    }
    close(exec_done[0]);
    return {pid, log};
  }

  // Whether `pid` has ended (it is left to reap).
  static bool HasExited(pid_t pid) {
    siginfo_t info{};
    return waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
  }

  // The port the server reports on stderr once it listens ("listening on port N"); 0 if it
  // exits first or does not within `timeout`.
  static int WaitForListening(const ServerProcess& server,
                              absl::Duration timeout = absl::Seconds(30)) {
    for (const absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;) {
      const std::string log = ReadFile(server.log);
      const size_t at = log.find("listening on port ");
      if (at != std::string::npos) return std::atoi(log.c_str() + at + 18);
      if (HasExited(server.pid)) return 0;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return 0;
  }

  // Sends `signal` and waits for the server to exit: its wait status, or nullopt (after
  // killing it) if it does not exit within `timeout`.
  static std::optional<int> StopServer(ServerProcess& server, int signal,
                                       absl::Duration timeout = absl::Seconds(10)) {
    if (kill(server.pid, signal) != 0) return std::nullopt;
    std::optional<int> result;
    for (const absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline && !result;) {
      int status = 0;
      if (waitpid(server.pid, &status, WNOHANG) == server.pid) {
        result = status;
      } else {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
    if (!result) {
      kill(server.pid, SIGKILL);
      waitpid(server.pid, nullptr, 0);
    }
    server.pid = -1;
    return result;
  }

  // The signals blocked by thread `tid` of `pid` (SigBlk in its /proc status), as a mask
  // with bit N-1 for signal N.
  static uint64_t BlockedSignals(pid_t pid, const std::string& tid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + tid + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
    }
    return 0;
  }
  static constexpr uint64_t kStopSignalsMask =
      (uint64_t{1} << (SIGINT - 1)) | (uint64_t{1} << (SIGTERM - 1));

  // Sends `signal` (SIGTERM or SIGINT) and expects the server to say so and exit 0 within
  // 10 s.
  static void ExpectStopsCleanly(ServerProcess& server, int signal) {
    const std::optional<int> status = StopServer(server, signal);
    ASSERT_TRUE(status.has_value()) << "the server did not exit within 10 s of "
                                    << strsignal(signal) << "; its log:\n"
                                    << ReadFile(server.log);
    ASSERT_TRUE(WIFEXITED(*status)) << "ended by signal " << WTERMSIG(*status);
    EXPECT_EQ(WEXITSTATUS(*status), 0) << ReadFile(server.log);
    EXPECT_NE(
        ReadFile(server.log).find(signal == SIGINT ? "SIGINT, stopping" : "SIGTERM, stopping"),
        std::string::npos)
        << ReadFile(server.log);
  }

  void SetUp() override {
    ASSERT_NE(port_, 0) << "the server " << server_bin_
                        << " did not start: " << ReadFile(server_.log);
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs the CLI with `args` (already shell-quoted where needed) against the server.
  static Result Run(const std::string& args, const std::string& server = "") {
    const std::string out = (dir_ / "stdout").string();
    const std::string err = (dir_ / "stderr").string();
    const std::string target = server.empty() ? "127.0.0.1:" + std::to_string(port_) : server;
    const std::string command = ShellQuote(cli_bin_) + " --server " + target +
                                " --client cli-test " + args + " >" + ShellQuote(out) + " 2>" +
                                ShellQuote(err);
    Result r;
    const int status = std::system(command.c_str());
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadFile(out);
    r.err = ReadFile(err);
    return r;
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  template <typename Message>
  static Message ParseJson(const std::string& json) {
    Message m;
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = true;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &m, options).ok()) << json;
    return m;
  }

  // Writes an .npy file of float64 values in the given order.
  void WriteNpy(const std::string& path, const std::vector<double>& values,
                std::vector<uint64_t> shape, bool fortran) {
    NpyHeader header{DType::kFloat64, std::move(shape), fortran};
    absl::StatusOr<NpyWriter> w = NpyWriter::Create(path, header);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(
        w->Write(std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 8))
            .ok());
    ASSERT_TRUE(w->Close().ok());
  }

  std::vector<double> ReadNpyDoubles(const std::string& path, NpyHeader* header = nullptr) {
    const std::string file = ReadFile(path);
    absl::StatusOr<NpyView> view = ParseNpy(std::string_view(file));
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) return {};
    if (header != nullptr) *header = view->parsed.header;
    std::vector<double> out(view->data.size() / 8);
    std::memcpy(out.data(), view->data.data(), out.size() * 8);
    return out;
  }

  static inline std::string server_bin_;
  static inline std::string cli_bin_;
  static inline std::filesystem::path dir_;
  static inline ServerProcess server_;
  static inline int port_ = 0;
};

std::vector<double> RandomValues(size_t n, uint32_t seed) {
  return testing::RandomDoubles(n, -3, 3, seed);
}

TEST_F(CliTest, PutAndGetRoundTripBothOrders) {
  for (bool fortran : {false, true}) {
    SCOPED_TRACE(fortran ? "F" : "C");
    const std::vector<double> values = RandomValues(6 * 7, 1);
    const std::string in = Path("in.npy");
    const std::string out = Path("out.npy");
    WriteNpy(in, values, {6, 7}, fortran);
    const std::string name = fortran ? "round_f" : "round_c";
    Result put = Run("--json put " + ShellQuote(in) + " --name " + name);
    ASSERT_EQ(put.exit_code, 0) << put.err;
    Result get = Run("get " + name + " -o " + ShellQuote(out));
    ASSERT_EQ(get.exit_code, 0) << get.err;
    EXPECT_EQ(ReadFile(out), ReadFile(in)) << "the .npy file did not come back byte for byte";
  }
}

// --request-id goes with every call: the error names it, and the server's log line about
// the failed call carries it. The server logs one JSON object per line.
TEST_F(CliTest, RequestIdIsShownAndLogged) {
  Result get =
      Run("--request-id cli-trace-42 get no_such_buffer_name -o " + ShellQuote(Path("never.npy")));
  EXPECT_NE(get.exit_code, 0);
  EXPECT_NE(get.err.find("NOT_FOUND"), std::string::npos) << get.err;
  EXPECT_NE(get.err.find("(request id cli-trace-42)"), std::string::npos) << get.err;
  const std::string log = ReadFile(server_.log);
  EXPECT_NE(log.find("\"request_id\":\"cli-trace-42\""), std::string::npos) << log;
  EXPECT_EQ(log.rfind("{\"time\":\"", 0), 0u) << log;
  EXPECT_NE(log.find("\"message\":\"cpu backend, listening on port "), std::string::npos) << log;
}

TEST_F(CliTest, EvalReduceAndGemvGiveReferenceValues) {
  const size_t n = 1000;
  const std::vector<double> x = RandomValues(n, 2);
  WriteNpy(Path("x.npy"), x, {n}, false);
  ASSERT_EQ(Run("put " + ShellQuote(Path("x.npy")) + " --name ex").exit_code, 0);

  Result eval =
      Run("--json eval " + ShellQuote("sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))") +
          " x=ex --name eval_r");
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  v1::Operation op = ParseJson<v1::Operation>(eval.out);
  EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED);
  EXPECT_EQ(op.timing().bytes_read(), n * 8);
  EXPECT_EQ(op.timing().bytes_written(), n * 8);
  ASSERT_EQ(Run("get eval_r -o " + ShellQuote(Path("r.npy"))).exit_code, 0);
  const std::vector<double> r = ReadNpyDoubles(Path("r.npy"));
  ASSERT_EQ(r.size(), n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = std::sqrt(
        std::abs(std::exp(-std::sin(x[i] * x[i])) / (std::sqrt(std::abs(x[i])) * std::tanh(x[i]))));
    EXPECT_NEAR(r[i], want, 1e-12 * std::abs(want)) << i;
    sum += want;
  }

  Result reduce = Run("--json reduce sum eval_r");
  ASSERT_EQ(reduce.exit_code, 0) << reduce.err;
  v1::Operation red = ParseJson<v1::Operation>(reduce.out);
  ASSERT_EQ(red.values_size(), 1);
  EXPECT_NEAR(red.values(0).float_value(), sum, 1e-12 * std::abs(sum));

  // A (3 x 2) in F order, times v.
  const std::vector<double> a_f = {1, 2, 3, 4, 5, 6};  // columns (1,2,3) and (4,5,6)
  WriteNpy(Path("a.npy"), a_f, {3, 2}, true);
  WriteNpy(Path("v.npy"), {10, 100}, {2}, false);
  ASSERT_EQ(Run("put " + ShellQuote(Path("a.npy")) + " --name ga").exit_code, 0);
  ASSERT_EQ(Run("put " + ShellQuote(Path("v.npy")) + " --name gv").exit_code, 0);
  Result gemv = Run("gemv ga gv --alpha 2 --name gy");
  ASSERT_EQ(gemv.exit_code, 0) << gemv.err;
  ASSERT_EQ(Run("get gy -o " + ShellQuote(Path("y.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("y.npy")), (std::vector<double>{2 * 410, 2 * 520, 2 * 630}));
  // Through views: rows 1 and 2 of A, times v reversed; rows 0 and 2 have no unit stride.
  Result viewed = Run("gemv 'ga[1:]' 'gv[::-1]' --name gy2");
  ASSERT_EQ(viewed.exit_code, 0) << viewed.err;
  ASSERT_EQ(Run("get gy2 -o " + ShellQuote(Path("y2.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("y2.npy")),
            (std::vector<double>{2 * 100 + 5 * 10, 3 * 100 + 6 * 10}));
  Result strided = Run("gemv 'ga[::2]' gv --name gy_never");
  EXPECT_EQ(strided.exit_code, 13) << strided.err;
  EXPECT_NE(strided.err.find("BLAS needs a unit stride"), std::string::npos) << strided.err;
}

TEST_F(CliTest, RandIsReproducibleAndContinues) {
  ASSERT_EQ(Run("rand uniform --shape 1000 --dtype float64 --seed 5 --name u1").exit_code, 0);
  ASSERT_EQ(Run("rand uniform --shape 1000 --dtype float64 --seed 5 --name u2").exit_code, 0);
  ASSERT_EQ(Run("get u1 -o " + ShellQuote(Path("u1.npy"))).exit_code, 0);
  ASSERT_EQ(Run("get u2 -o " + ShellQuote(Path("u2.npy"))).exit_code, 0);
  const std::vector<double> u = ReadNpyDoubles(Path("u1.npy"));
  EXPECT_EQ(u, ReadNpyDoubles(Path("u2.npy")));
  for (double v : u) {
    EXPECT_GE(v, 0.0);
    EXPECT_LT(v, 1.0);
  }
  // float64 uniforms use two values per counter: counters 250.. give elements 500..
  Result tail =
      Run("--json rand uniform --shape 500 --dtype float64 --seed 5 --offset 250 --name u3");
  ASSERT_EQ(tail.exit_code, 0) << tail.err;
  EXPECT_EQ(ParseJson<v1::Operation>(tail.out).next_offset(), 500u);
  ASSERT_EQ(Run("get u3 -o " + ShellQuote(Path("u3.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("u3.npy")), std::vector<double>(u.begin() + 500, u.end()));
}

// "rand normal" is transform v2 and "rand normal-v3" the newest, v3, bit for bit as
// kernels/philox.h defines them; "rand normal-v1" reproduces the original one.
TEST_F(CliTest, RandNormalUsesV2AndCanAskForV3AndV1) {
  const auto fill = [&](const std::string& distribution, const std::string& name) {
    EXPECT_EQ(Run("rand " + distribution + " --shape 64 --dtype float64 --seed 5 --name " + name)
                  .exit_code,
              0);
    EXPECT_EQ(Run("get " + name + " -o " + ShellQuote(Path(name + ".npy"))).exit_code, 0);
    return ReadNpyDoubles(Path(name + ".npy"));
  };
  const std::vector<double> v2 = fill("normal", "n2");
  const std::vector<double> v2_named = fill("normal-v2", "n2n");
  const std::vector<double> v3 = fill("normal-v3", "n3");
  const std::vector<float> v3_float32 = [&] {
    EXPECT_EQ(Run("rand normal-v3 --shape 64 --dtype float32 --seed 5 --name n3f").exit_code, 0);
    EXPECT_EQ(Run("get n3f -o " + ShellQuote(Path("n3f.npy"))).exit_code, 0);
    const std::string file = ReadFile(Path("n3f.npy"));
    absl::StatusOr<NpyView> view = ParseNpy(std::string_view(file));
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) return std::vector<float>();
    EXPECT_EQ(view->parsed.header.dtype, DType::kFloat32);
    std::vector<float> values(view->data.size() / sizeof(float));
    std::memcpy(values.data(), view->data.data(), values.size() * sizeof(float));
    return values;
  }();
  const std::vector<double> v1_values = fill("normal-v1", "n1");
  ASSERT_EQ(v3.size(), 64u);
  ASSERT_EQ(v2.size(), 64u);
  ASSERT_EQ(v1_values.size(), 64u);
  EXPECT_EQ(v2, v2_named);
  ASSERT_EQ(v3_float32.size(), 64u);
  RandomParams p;
  p.distribution = Distribution::kNormal;
  p.seed = 5;
  for (uint64_t i = 0; i < 64; ++i) {
    p.normal_transform = NormalTransform::kInverseCdfV3;
    EXPECT_EQ(v3[i], RandomElement<double>(p, i)) << i;  // float64 v3: v2's values
    EXPECT_EQ(v3_float32[i], RandomElement<float>(p, i)) << i;
    p.normal_transform = NormalTransform::kBoxMullerV2;
    EXPECT_EQ(v2[i], RandomElement<double>(p, i)) << i;
    p.normal_transform = NormalTransform::kBoxMullerV1;
    EXPECT_NEAR(v1_values[i], RandomElement<double>(p, i), 1e-12) << i;
  }
  EXPECT_NE(v2, v1_values);
  Result unknown = Run("rand normal-v4 --shape 4 --dtype float64");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.err;
  EXPECT_NE(unknown.err.find("unknown distribution 'normal-v4' (uniform normal normal-v1 "
                             "normal-v2 normal-v3 integers)"),
            std::string::npos)
      << unknown.err;
  Result mean_of_uniform = Run("rand uniform --shape 4 --dtype float64 --mean 1");
  EXPECT_EQ(mean_of_uniform.exit_code, 2) << mean_of_uniform.err;
}

TEST_F(CliTest, ListAndRemove) {
  ASSERT_EQ(Run("create --dtype int32 --shape 4,5 --fill 3 --name lr").exit_code, 0);
  Result ls = Run("--json ls");
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  v1::ListBuffersResponse list = ParseJson<v1::ListBuffersResponse>(ls.out);
  bool found = false;
  for (const v1::BufferInfo& b : list.buffers()) found |= b.name() == "lr";
  EXPECT_TRUE(found) << ls.out;
  EXPECT_EQ(Run("rm lr").exit_code, 0);
  EXPECT_EQ(Run("rm lr").exit_code, 15) << "NOT_FOUND is 10 + 5";
}

TEST_F(CliTest, TtlAndRenew) {
  Result create = Run("--json create --shape 4 --name leased --ttl 600");
  ASSERT_EQ(create.exit_code, 0) << create.err;
  EXPECT_EQ(ParseJson<v1::BufferInfo>(create.out).ttl_seconds(), 600);
  Result renew = Run("--json renew leased --ttl 0");
  ASSERT_EQ(renew.exit_code, 0) << renew.err;
  const v1::BufferInfo renewed = ParseJson<v1::BufferInfo>(renew.out);
  EXPECT_EQ(renewed.name(), "leased");
  EXPECT_EQ(renewed.ttl_seconds(), 0);
  EXPECT_EQ(Run("create --shape 4 --ttl -1").exit_code, 13) << "INVALID_ARGUMENT is 10 + 3";
  EXPECT_EQ(Run("renew leased --ttl 1e9").exit_code, 13);
  EXPECT_EQ(Run("renew no_such_buffer").exit_code, 15);
  EXPECT_EQ(Run("rm leased").exit_code, 0);
}

TEST_F(CliTest, ErrorsHaveTheirExitCodes) {
  Result missing = Run("get no_such_buffer -o " + ShellQuote(Path("none.npy")));
  EXPECT_EQ(missing.exit_code, 15) << "NOT_FOUND is 10 + 5";
  EXPECT_NE(missing.err.find("no_such_buffer"), std::string::npos) << missing.err;

  ASSERT_EQ(Run("create --dtype float64 --shape 3 --fill 1 --name e1").exit_code, 0);
  Result bad_expr = Run("eval " + ShellQuote("x + ") + " x=e1 --name e2");
  EXPECT_EQ(bad_expr.exit_code, 13) << "INVALID_ARGUMENT is 10 + 3";
  EXPECT_NE(bad_expr.err.find("position"), std::string::npos) << bad_expr.err;
  Result ls = Run("--json ls");
  EXPECT_EQ(ls.out.find("\"e2\""), std::string::npos) << "a rejected eval created its output";

  Result usage = Run("reduce");
  EXPECT_EQ(usage.exit_code, 2) << usage.err;

  std::ofstream(Path("bad.npy")) << "this is not an npy file";
  Result bad_file = Run("put " + ShellQuote(Path("bad.npy")));
  EXPECT_EQ(bad_file.exit_code, 1) << bad_file.err;

  Result too_big = Run("create --dtype float64 --shape 1000000000");
  EXPECT_EQ(too_big.exit_code, 18) << "RESOURCE_EXHAUSTED is 10 + 8";

  Result no_server = Run("info", "127.0.0.1:1");
  EXPECT_EQ(no_server.exit_code, 24) << "UNAVAILABLE is 10 + 14";
}

TEST_F(CliTest, RunSendsAFileThroughOneSession) {
  const std::vector<double> x = {1, 2, 3, 4, 5};
  WriteNpy(Path("rx.npy"), x, {x.size()}, false);
  ASSERT_EQ(Run("put " + ShellQuote(Path("rx.npy")) + " --name rx").exit_code, 0);
  std::ofstream(Path("ok.ops")) << "# (x - 1)^2, its sum and its max\n"
                                   "@d eval 'x - 1' x=rx\n"
                                   "\n"
                                   "@y eval \"d * d\" d=tag:d --name run_y  # kept\n"
                                   "reduce sum tag:y\n"
                                   "@m reduce max tag:d\n";
  Result ok = Run("--json run " + ShellQuote(Path("ok.ops")));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  std::map<std::string, v1::Operation> answers;
  for (absl::string_view line : absl::StrSplit(ok.out, '\n', absl::SkipEmpty())) {
    const auto answer = ParseJson<v1::ChainStepResult>(std::string(line));
    answers[answer.tag()] = answer.operation();
  }
  ASSERT_EQ(answers.size(), 4u) << ok.out;
  for (const auto& [tag, op] : answers) {
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << tag << ": " << op.error_message();
  }
  ASSERT_EQ(answers["5"].values_size(), 1);
  EXPECT_EQ(answers["5"].values(0).float_value(), 0 + 1 + 4 + 9 + 16);
  EXPECT_EQ(answers["m"].values(0).float_value(), 4);
  ASSERT_EQ(Run("get run_y -o " + ShellQuote(Path("run_y.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("run_y.npy")), (std::vector<double>{0, 1, 4, 9, 16}));

  // A failure fails its dependents, the rest runs, and the exit code is the first
  // failure's; the text output names every tag.
  std::ofstream(Path("fail.ops")) << "@bad eval 'x +' x=rx\n"
                                     "@dep reduce sum tag:bad\n"
                                     "@fine eval 'x * 10' x=rx --name run_fine\n";
  Result failed = Run("run " + ShellQuote(Path("fail.ops")));
  EXPECT_EQ(failed.exit_code, 13) << "INVALID_ARGUMENT is 10 + 3: " << failed.err;
  EXPECT_NE(failed.out.find("bad "), std::string::npos) << failed.out;
  EXPECT_NE(failed.out.find("tag 'bad'"), std::string::npos) << failed.out;
  ASSERT_EQ(Run("get run_fine -o " + ShellQuote(Path("run_fine.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("run_fine.npy")), (std::vector<double>{10, 20, 30, 40, 50}));

  // A malformed line runs nothing.
  std::ofstream(Path("usage.ops")) << "eval 'x + 1' x=rx --name run_never\n"
                                      "ls\n";
  Result usage = Run("run " + ShellQuote(Path("usage.ops")));
  EXPECT_EQ(usage.exit_code, 2) << usage.err;
  EXPECT_NE(usage.err.find(":2:"), std::string::npos) << usage.err;
  EXPECT_EQ(Run("--json ls").out.find("run_never"), std::string::npos);
}

TEST_F(CliTest, InfoStatsAndStreams) {
  Result info = Run("--json info");
  ASSERT_EQ(info.exit_code, 0) << info.err;
  v1::ServerInfo si = ParseJson<v1::ServerInfo>(info.out);
  EXPECT_EQ(si.backend(), "cpu");
  EXPECT_EQ(si.api(), "gpucompute.v1");
  EXPECT_EQ(si.memory_limit_bytes(), 512u << 20);

  Result stream = Run("--json stream create");
  ASSERT_EQ(stream.exit_code, 0) << stream.err;
  const std::string id = ParseJson<v1::StreamInfo>(stream.out).id();
  ASSERT_EQ(id.rfind("str-", 0), 0u) << stream.out;
  ASSERT_EQ(Run("--stream " + id +
                " rand normal --shape 100 --dtype float32 --seed 1 --name sn --no-wait")
                .exit_code,
            0);
  EXPECT_EQ(Run("stream sync " + id).exit_code, 0);
  EXPECT_EQ(Run("stream rm " + id).exit_code, 0);
  EXPECT_EQ(Run("stream rm " + id).exit_code, 15);

  Result stats = Run("--json stats");
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  v1::Stats st = ParseJson<v1::Stats>(stats.out);
  EXPECT_GT(st.kinds_size(), 0);
}

TEST_F(CliTest, InfoShowsPoolsTrimAndProfile) {
  auto pool_used = [&] {
    Result info = Run("--json info");
    EXPECT_EQ(info.exit_code, 0) << info.err;
    v1::ServerInfo si = ParseJson<v1::ServerInfo>(info.out);
    EXPECT_EQ(si.devices_size(), 1) << info.out;
    EXPECT_EQ(si.backend_error(), "") << info.out;
    return si.devices_size() == 1 ? si.devices(0).pool_used_bytes() : ~uint64_t{0};
  };
  const uint64_t before = pool_used();
  ASSERT_EQ(Run("create --shape 1000 --dtype float64 --name pooled").exit_code, 0);
  EXPECT_EQ(pool_used(), before + 8000);

  Result text = Run("info");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("pool 0"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("reserved"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("FAILED"), std::string::npos) << text.out;

  Result trim = Run("--json trim --keep 1024");
  ASSERT_EQ(trim.exit_code, 0) << trim.err;
  v1::TrimMemoryPoolResponse trimmed = ParseJson<v1::TrimMemoryPoolResponse>(trim.out);
  ASSERT_EQ(trimmed.pools_size(), 1) << trim.out;
  EXPECT_EQ(trimmed.pools(0).device(), 0);
  EXPECT_EQ(trimmed.pools(0).used_bytes(), before + 8000);
  Result trim_text = Run("trim --device 0");
  ASSERT_EQ(trim_text.exit_code, 0) << trim_text.err;
  EXPECT_NE(trim_text.out.find("RESERVED"), std::string::npos) << trim_text.out;
  EXPECT_EQ(Run("trim --device 3").exit_code, 13) << "INVALID_ARGUMENT is 10 + 3";
  EXPECT_EQ(Run("trim --device x").exit_code, 2);
  EXPECT_EQ(Run("trim --keep -1").exit_code, 2);
  EXPECT_EQ(Run("rm pooled").exit_code, 0);
  EXPECT_EQ(pool_used(), before);

  Result start = Run("profile start");
  EXPECT_EQ(start.exit_code, 19) << "FAILED_PRECONDITION is 10 + 9";
  EXPECT_NE(start.err.find("FAILED_PRECONDITION"), std::string::npos) << start.err;
  EXPECT_EQ(Run("--json profile stop").exit_code, 19);
  EXPECT_EQ(Run("profile").exit_code, 2);
  EXPECT_EQ(Run("profile pause").exit_code, 2);
}

TEST_F(CliTest, ServerAcceptsPoolAndKernelCacheFlags) {
  ServerProcess server = SpawnServer(
      {"--listen=127.0.0.1:0", "--backend=cpu", "--pool-initial=1MiB",
       "--pool-release-threshold=keep", "--kernel-cache-dir=none", "--default-device=0"},
      Path("flags.log"));
  const int port = WaitForListening(server);
  EXPECT_NE(port, 0) << ReadFile(server.log);
  if (port != 0) {
    Result info = Run("--json info", "127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(info.exit_code, 0) << info.err;
    EXPECT_EQ(ParseJson<v1::ServerInfo>(info.out).default_device(), 0);
  }
  ExpectStopsCleanly(server, SIGTERM);
}

TEST_F(CliTest, ServerStopsCleanlyOnSigtermAndSigint) {
  for (int signal : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(strsignal(signal));
    ServerProcess server = SpawnServer({"--listen=127.0.0.1:0", "--backend=cpu"}, Path("stop.log"));
    ASSERT_NE(WaitForListening(server), 0) << ReadFile(server.log);
    ExpectStopsCleanly(server, signal);
  }
}

// Queued work must not hold a stopping server past its grace (a pod's grace period is
// short): six queued fills once kept it alive 12.6 s after SIGTERM. What is on the device
// finishes; what has not started fails, and the server exits 0.
TEST_F(CliTest, ServerCancelsQueuedWorkAfterTheShutdownGrace) {
  ServerProcess server = SpawnServer({"--listen=127.0.0.1:0", "--backend=cpu", "--cpu-threads=1",
                                      "--shutdown-grace=300ms", "--memory-limit=256MiB"},
                                     Path("grace.log"));
  const int port = WaitForListening(server);
  ASSERT_NE(port, 0) << ReadFile(server.log);
  ClientOptions options;
  options.target = "127.0.0.1:" + std::to_string(port);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  v1::SubmitRequest fill =
      Random(v1::DISTRIBUTION_UNIFORM, {1 << 21}, v1::DTYPE_FLOAT64, 1, NewOutput("x"));
  fill.set_wait(true);
  ASSERT_TRUE((*client)->Submit(fill).ok());
  v1::SubmitRequest heavy = Elementwise("sin(x) * cos(x) + exp(x) * tanh(x) + sqrt(x) * log1p(x)",
                                        {{"x", BufferOperand("x")}}, NewOutput("y"));
  heavy.set_wait(true);
  const absl::Time first = absl::Now();
  ASSERT_TRUE((*client)->Submit(heavy).ok());
  const absl::Duration one = absl::Now() - first;
  *heavy.mutable_elementwise()->mutable_output() = ExistingOutput("y");
  heavy.set_wait(false);
  // About 8 s of work, queued on one stream.
  const int queued = std::clamp(static_cast<int>(absl::Seconds(8) / one), 8, 400);
  for (int i = 0; i < queued; ++i) ASSERT_TRUE((*client)->Submit(heavy).ok());

  const absl::Time stop = absl::Now();
  const std::optional<int> status = StopServer(server, SIGTERM, absl::Seconds(60));
  const absl::Duration took = absl::Now() - stop;
  ASSERT_TRUE(status.has_value()) << "the server did not exit within 60 s";
  ASSERT_TRUE(WIFEXITED(*status)) << "ended by signal " << WTERMSIG(*status);
  EXPECT_EQ(WEXITSTATUS(*status), 0) << ReadFile(server.log);
  EXPECT_NE(ReadFile(server.log).find("queued operations did not start within the shutdown grace"),
            std::string::npos)
      << ReadFile(server.log);
  // The grace, the operation that was running and a margin for a loaded machine; the
  // queued work alone would take about 8 s.
  EXPECT_LT(took, absl::Milliseconds(300) + 2 * one + absl::Seconds(2))
      << queued << " operations of " << one << " each were queued";
}

// SIGTERM as soon as main has blocked the stop signals, its first act: before the server
// listens. The first change to the main thread's mask is that one (no thread exists yet
// whose creation would mask signals for a moment). Before it, in the dynamic loader, no
// program's code can take a signal; the next test covers a signal already pending then.
TEST_F(CliTest, ServerStopsCleanlyOnSigtermBeforeItListens) {
  ServerProcess server = SpawnServer({"--listen=127.0.0.1:0", "--backend=cpu"}, Path("early.log"));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while ((BlockedSignals(server.pid, std::to_string(server.pid)) & kStopSignalsMask) !=
         kStopSignalsMask) {
    ASSERT_FALSE(HasExited(server.pid)) << ReadFile(server.log);
    ASSERT_LT(absl::Now(), deadline) << "the server did not block SIGTERM within 30 s";
    absl::SleepFor(absl::Microseconds(200));
  }
  ExpectStopsCleanly(server, SIGTERM);
}

TEST_F(CliTest, ServerStopsCleanlyOnSigtermSentRightAfterExec) {
  ServerProcess server = SpawnServer({"--listen=127.0.0.1:0", "--backend=cpu"}, Path("exec.log"),
                                     /*block_stop_signals=*/true);
  ExpectStopsCleanly(server, SIGTERM);
}

// No thread of the server may take a stop signal's default action or run a handler: all
// of them, gRPC's and the backend's included, keep SIGINT and SIGTERM blocked, except the
// one that takes them: sigwait unblocks the signals it waits for while it waits.
TEST_F(CliTest, OnlyOneServerThreadTakesTheStopSignals) {
  int threads = 0;
  int taking = 0;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(server_.pid) + "/task")) {
    const uint64_t blocked =
        BlockedSignals(server_.pid, task.path().filename().string()) & kStopSignalsMask;
    EXPECT_TRUE(blocked == 0 || blocked == kStopSignalsMask) << blocked;
    taking += blocked == 0;
    ++threads;
  }
  EXPECT_EQ(taking, 1);
  // main, the signal watcher, the CPU backend's two workers and gRPC's threads.
  EXPECT_GE(threads, 5);
}

TEST_F(CliTest, ServerProgramLinksNoCudaLibrary) {
  const std::string out = Path("ldd.out");
  const int status =
      std::system(("ldd " + ShellQuote(server_bin_) + " >" + ShellQuote(out) + " 2>&1").c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    GTEST_SKIP() << "ldd does not run here: " << ReadFile(out);
  const std::string libraries = ReadFile(out);
  EXPECT_NE(libraries.find("libgrpc++"), std::string::npos) << libraries;
  for (const char* cuda : {"libcuda.", "libcudart", "libcublas", "libnvrtc"}) {
    EXPECT_EQ(libraries.find(cuda), std::string::npos) << cuda << " in\n" << libraries;
  }
}

// --backend=cuda without what it needs fails at start, exit 1, saying what is missing:
// the driver where there is none, else the module (here a path that does not exist).
TEST_F(CliTest, CudaBackendWithoutDriverOrModuleFailsClearly) {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver != nullptr) dlclose(driver);
  const std::string err = Path("cuda.err");
  const int status = std::system(
      (ShellQuote(server_bin_) +
       " --backend=cuda --listen=127.0.0.1:0 --cuda-module=/nonexistent/libmodule.so 2>" +
       ShellQuote(err))
          .c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << ReadFile(err);
  if (driver == nullptr) {
    EXPECT_NE(ReadFile(err).find("--backend=cuda: the NVIDIA driver is not installed here"),
              std::string::npos)
        << ReadFile(err);
  } else {
    EXPECT_NE(ReadFile(err).find("cannot find the CUDA backend module"), std::string::npos)
        << ReadFile(err);
    EXPECT_NE(ReadFile(err).find("/nonexistent/libmodule.so"), std::string::npos) << ReadFile(err);
  }
}

TEST_F(CliTest, AutoBackendIsTheCpuWithoutDriver) {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver != nullptr) {
    dlclose(driver);
    GTEST_SKIP() << "the NVIDIA driver is installed here";
  }
  ServerProcess server = SpawnServer({"--listen=127.0.0.1:0", "--backend=auto"}, Path("auto.log"));
  EXPECT_NE(WaitForListening(server), 0) << ReadFile(server.log);
  EXPECT_NE(ReadFile(server.log).find("cpu backend, listening"), std::string::npos)
      << ReadFile(server.log);
  ExpectStopsCleanly(server, SIGTERM);
}

TEST_F(CliTest, ServerRejectsBadFlags) {
  const std::string err = Path("flags.err");
  const int status =
      std::system((ShellQuote(server_bin_) + " --memory-limit=lots 2>" + ShellQuote(err)).c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(ReadFile(err).find("--memory-limit"), std::string::npos) << ReadFile(err);
  const int backend =
      std::system((ShellQuote(server_bin_) + " --backend=tpu 2>" + ShellQuote(err)).c_str());
  EXPECT_EQ(WEXITSTATUS(backend), 1);
  EXPECT_NE(ReadFile(err).find("unknown backend"), std::string::npos) << ReadFile(err);

  // Malformed values are usage errors (exit 2) naming the flag.
  for (const std::string flag :
       {"--pool-initial=lots", "--pool-release-threshold=some", "--default-device=-1",
        "--default-device=first", "--region-idle-timeout=-1", "--allow-shared-memory=maybe",
        "--allow-cuda-ipc=2"}) {
    const int code =
        std::system((ShellQuote(server_bin_) + " " + flag + " 2>" + ShellQuote(err)).c_str());
    EXPECT_EQ(WEXITSTATUS(code), 2) << flag;
    EXPECT_NE(ReadFile(err).find(flag.substr(0, flag.find('='))), std::string::npos)
        << ReadFile(err);
  }
  // A device the backend does not have fails at start (exit 1).
  const int device =
      std::system((ShellQuote(server_bin_) +
                   " --backend=cpu --listen=127.0.0.1:0 --default-device=3 2>" + ShellQuote(err))
                      .c_str());
  EXPECT_EQ(WEXITSTATUS(device), 1);
  EXPECT_NE(ReadFile(err).find("device 3 does not exist"), std::string::npos) << ReadFile(err);
}

// A server started with --allow-shared-memory, and a library client of it.
class SharedMemoryServer {
 public:
  explicit SharedMemoryServer(ServerProcess process, int port) : process_(std::move(process)) {
    ClientOptions options;
    options.target = target(port);
    options.client_name = "cli-test";
    options.timeout = absl::Seconds(60);
    client_ = *Client::Connect(options);
    target_ = options.target;
    stub_ = v1::SharedMemoryService::NewStub(client_->channel());
  }
  // A server a failed test did not stop goes here.
  ~SharedMemoryServer() {
    if (process_.pid > 0) {
      kill(process_.pid, SIGKILL);
      waitpid(process_.pid, nullptr, 0);
    }
  }
  static std::string target(int port) { return "127.0.0.1:" + std::to_string(port); }
  const std::string& target() const { return target_; }
  ServerProcess& process() { return process_; }
  Client& client() { return *client_; }
  int Regions() {
    v1::ListRegionsResponse response;
    grpc::Status status = stub_->ListRegions(client_->NewContext(true).get(), {}, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.regions_size();
  }

 private:
  ServerProcess process_;
  std::string target_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::SharedMemoryService::Stub> stub_;
};

// Whether `pid`'s memory map, or /dev/shm, still has a segment of the CLI process `cli`.
bool MapsSegmentOf(pid_t pid, pid_t cli) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  const std::string needle = "/gpucompute-" + std::to_string(cli) + "-";
  for (std::string line; std::getline(maps, line);) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}
bool ShmFileOf(pid_t cli) {
  const std::string prefix = "gpucompute-" + std::to_string(cli) + "-";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) return true;
  }
  return false;
}

TEST_F(CliTest, PutAndGetChooseTheirTransport) {
  const std::vector<double> values = RandomValues(3 * 1000, 11);
  const std::string in = Path("transport_in.npy");
  WriteNpy(in, values, {3, 1000}, false);

  // This server does not allow shared memory: auto takes gRPC, shm is refused naming the flag.
  Result put = Run("--json put " + ShellQuote(in) + " --name t_auto --transport=auto");
  ASSERT_EQ(put.exit_code, 0) << put.err;
  EXPECT_NE(put.out.find("\"transport\":\"grpc\""), std::string::npos) << put.out;
  Result refused = Run("put " + ShellQuote(in) + " --name t_shm --transport=shm");
  EXPECT_EQ(refused.exit_code, 19) << "FAILED_PRECONDITION is 10 + 9: " << refused.err;
  EXPECT_NE(refused.err.find("--allow-shared-memory"), std::string::npos) << refused.err;
  EXPECT_EQ(Run("--json ls").out.find("t_shm"), std::string::npos);
  Result get_refused = Run("get t_auto -o " + ShellQuote(Path("refused.npy")) + " --transport=shm");
  EXPECT_EQ(get_refused.exit_code, 19) << get_refused.err;
  EXPECT_FALSE(std::filesystem::exists(Path("refused.npy")));
  EXPECT_EQ(Run("put " + ShellQuote(in) + " --transport=pigeon").exit_code, 2);

  // One that does: auto takes shared memory, and every path gives back the same bytes.
  auto [process, port] = SpawnSharedMemoryServer(Path("shm_server.log"));
  ASSERT_NE(port, 0) << ReadFile(process.log);
  SharedMemoryServer shm(process, port);
  put = Run("--json put " + ShellQuote(in) + " --name t_shm", shm.target());
  ASSERT_EQ(put.exit_code, 0) << put.err;
  EXPECT_NE(put.out.find("\"transport\":\"shm\""), std::string::npos) << put.out;
  for (const std::string transport : {"auto", "shm", "grpc"}) {
    const std::string out = Path("transport_" + transport + ".npy");
    Result get =
        Run("--json get t_shm -o " + ShellQuote(out) + " --transport=" + transport, shm.target());
    ASSERT_EQ(get.exit_code, 0) << transport << ": " << get.err;
    EXPECT_NE(get.out.find(std::string("\"transport\":\"") +
                           (transport == "grpc" ? "grpc" : "shm") + "\""),
              std::string::npos)
        << get.out;
    EXPECT_EQ(ReadNpyDoubles(out), values) << transport;
    EXPECT_EQ(ReadFile(out), ReadFile(in)) << transport;
  }
  // Into part of an existing buffer, through shared memory.
  const std::vector<double> patch = RandomValues(500, 12);
  WriteNpy(Path("patch.npy"), patch, {500}, false);
  Result into =
      Run("put " + ShellQuote(Path("patch.npy")) + " --into t_shm --offset 8000", shm.target());
  ASSERT_EQ(into.exit_code, 0) << into.err;
  EXPECT_NE(into.out.find("via shm"), std::string::npos) << into.out;
  ASSERT_EQ(Run("get t_shm -o " + ShellQuote(Path("patched.npy")), shm.target()).exit_code, 0);
  std::vector<double> expected = values;
  std::copy(patch.begin(), patch.end(), expected.begin() + 1000);
  EXPECT_EQ(ReadNpyDoubles(Path("patched.npy")), expected);
  EXPECT_EQ(shm.Regions(), 0) << "the CLI left its region registered";
  ExpectStopsCleanly(shm.process(), SIGTERM);
}

// A `--json` put or get's answer, parsed: its "transport" and "segment_bytes".
struct TransferAnswer {
  std::string transport;
  double segment_bytes = -1;
};
TransferAnswer ParseTransferAnswer(const std::string& json) {
  google::protobuf::Struct document;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &document).ok()) << json;
  TransferAnswer answer;
  const auto& fields = document.fields();
  if (auto it = fields.find("transport"); it != fields.end()) {
    answer.transport = it->second.string_value();
  }
  if (auto it = fields.find("segment_bytes"); it != fields.end()) {
    answer.segment_bytes = it->second.number_value();
  }
  return answer;
}

// Writes a .npy file of `header` holding `data`, as stored.
void WriteNpyBytes(const std::string& path, const NpyHeader& header, std::string_view data) {
  absl::StatusOr<NpyWriter> w = NpyWriter::Create(path, header);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Write(data).ok());
  ASSERT_TRUE(w->Close().ok());
}

TEST_F(CliTest, SharedMemoryPutAndGetInPiecesReproduceTheData) {
  auto [process, port] = SpawnSharedMemoryServer(Path("pieces_server.log"));
  ASSERT_NE(port, 0) << ReadFile(process.log);
  SharedMemoryServer shm(process, port);
  // An 8 KiB segment moves in pieces of 2 KiB; no segment is smaller than a page.
  constexpr uint64_t kSegment = 8192, kPiece = 2048, kPage = 4096;
  struct Case {
    std::string name;
    NpyHeader header;
  };
  const std::vector<Case> cases = {
      {"zero_d", {DType::kFloat64, {}, false}},
      {"one_piece_and_a_byte", {DType::kBool, {kPiece + 1}, false}},
      {"one_segment_and_a_byte", {DType::kBool, {kSegment + 1}, false}},
      {"not_a_multiple", {DType::kFloat64, {10007}, false}},
      {"fortran", {DType::kFloat32, {37, 29}, true}},
  };
  uint32_t seed = 20;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    uint64_t bytes = c.header.dtype == DType::kBool ? 1 : c.header.dtype == DType::kFloat32 ? 4 : 8;
    for (uint64_t d : c.header.shape) bytes *= d;
    std::string data(bytes, '\0');
    std::mt19937 random(seed++);
    for (char& b : data) {
      b = static_cast<char>(c.header.dtype == DType::kBool ? random() % 2 : random());
    }
    const std::string in = Path(c.name + "_in.npy");
    WriteNpyBytes(in, c.header, data);
    const uint64_t segment = std::max(kPage, std::min(bytes, kSegment));

    Result put = Run("--json put " + ShellQuote(in) + " --name " + c.name +
                         " --transport=shm --shm-segment=8KiB",
                     shm.target());
    ASSERT_EQ(put.exit_code, 0) << put.err;
    TransferAnswer answer = ParseTransferAnswer(put.out);
    EXPECT_EQ(answer.transport, "shm");
    EXPECT_EQ(answer.segment_bytes, segment);
    // What the server holds, read back over gRPC: the upload alone is checked here.
    std::string held;
    v1::DownloadRequest request;
    request.set_buffer(c.name);
    ASSERT_TRUE(shm.client().Download(request, &held).ok());
    EXPECT_TRUE(held == data) << "the buffer does not hold the file's bytes";

    const std::string out = Path(c.name + "_out.npy");
    Result get = Run("--json get " + c.name + " -o " + ShellQuote(out) +
                         " --transport=shm --shm-segment=8KiB",
                     shm.target());
    ASSERT_EQ(get.exit_code, 0) << get.err;
    answer = ParseTransferAnswer(get.out);
    EXPECT_EQ(answer.transport, "shm");
    EXPECT_EQ(answer.segment_bytes, segment);
    EXPECT_TRUE(ReadFile(out) == ReadFile(in)) << "the .npy file did not come back byte for byte";
  }

  // Into part of an existing buffer, in pieces: bytes [8, 8 + 8193) change, no others.
  const std::string patch(kSegment + 1, '\1');
  WriteNpyBytes(Path("patch.npy"), {DType::kBool, {kSegment + 1}, false}, patch);
  ASSERT_TRUE(shm.client().CreateBuffer([] {
    v1::CreateBufferRequest create;
    create.set_name("patched");
    create.set_dtype(v1::DTYPE_BOOL);
    create.add_shape(3 * kSegment);
    return create;
  }()).ok());
  Result into = Run("put " + ShellQuote(Path("patch.npy")) +
                        " --into patched --offset 8 --transport=shm --shm-segment=8KiB",
                    shm.target());
  ASSERT_EQ(into.exit_code, 0) << into.err;
  std::string held;
  v1::DownloadRequest request;
  request.set_buffer("patched");
  ASSERT_TRUE(shm.client().Download(request, &held).ok());
  std::string expected(3 * kSegment, '\0');
  expected.replace(8, patch.size(), patch);
  EXPECT_TRUE(held == expected);

  // A segment size that is not one is a usage error and changes nothing.
  absl::StatusOr<v1::ServerInfo> before = shm.client().GetServerInfo();
  ASSERT_TRUE(before.ok());
  Result bad = Run("put " + ShellQuote(Path("patch.npy")) +
                       " --name bad --transport=shm --shm-segment=8KiX",
                   shm.target());
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--shm-segment: '8KiX' has an unknown unit"), std::string::npos)
      << bad.err;
  Result bad_grpc =
      Run("get patched -o " + ShellQuote(Path("bad.npy")) + " --transport=grpc --shm-segment=-1",
          shm.target());
  EXPECT_EQ(bad_grpc.exit_code, 2) << bad_grpc.err;
  EXPECT_NE(bad_grpc.err.find("--shm-segment: "), std::string::npos) << bad_grpc.err;
  EXPECT_FALSE(std::filesystem::exists(Path("bad.npy")));
  absl::StatusOr<v1::ListBuffersResponse> list = shm.client().ListBuffers();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->buffers_size(), static_cast<int>(cases.size()) + 1);
  absl::StatusOr<v1::ServerInfo> after = shm.client().GetServerInfo();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->memory_used_bytes(), before->memory_used_bytes());
  EXPECT_EQ(shm.Regions(), 0) << "the CLI left its region registered";
  ExpectStopsCleanly(shm.process(), SIGTERM);
}

TEST_F(CliTest, SharedMemoryPutAndGetMapABoundedSegment) {
  auto [process, port] = SpawnSharedMemoryServer(Path("bounded_server.log"));
  ASSERT_NE(port, 0) << ReadFile(process.log);
  SharedMemoryServer shm(process, port);
  // One float64 more than the default segment holds.
  const size_t n = (kOneShotSegmentBytes >> 3) + 1;
  const std::vector<double> values = RandomValues(n, 30);
  const std::string in = Path("bounded_in.npy");
  WriteNpy(in, values, {n}, false);
  Result put = Run("--json put " + ShellQuote(in) + " --name bounded", shm.target());
  ASSERT_EQ(put.exit_code, 0) << put.err;
  TransferAnswer answer = ParseTransferAnswer(put.out);
  EXPECT_EQ(answer.transport, "shm");
  EXPECT_EQ(answer.segment_bytes, kOneShotSegmentBytes);
  // The lease it was put under is over.
  absl::StatusOr<v1::BufferInfo> put_buffer = shm.client().GetBuffer("bounded");
  ASSERT_TRUE(put_buffer.ok()) << put_buffer.status();
  EXPECT_EQ(put_buffer->ttl_seconds(), 0);
  EXPECT_EQ(put_buffer->lease_expire_time_unix_nanos(), 0);
  const std::string out = Path("bounded_out.npy");
  Result get = Run("--json get bounded -o " + ShellQuote(out), shm.target());
  ASSERT_EQ(get.exit_code, 0) << get.err;
  answer = ParseTransferAnswer(get.out);
  EXPECT_EQ(answer.transport, "shm");
  EXPECT_EQ(answer.segment_bytes, kOneShotSegmentBytes);
  EXPECT_TRUE(ReadNpyDoubles(out) == values);
  std::error_code ec;
  std::filesystem::remove(in, ec);
  std::filesystem::remove(out, ec);
  ExpectStopsCleanly(shm.process(), SIGTERM);
}

// A library upload larger than its segment fails midway when its reader does: the new
// buffer it created is gone, and the server's memory is as before.
TEST_F(CliTest, SharedMemoryUploadInPiecesThatFailsLeavesNothing) {
  auto [process, port] = SpawnSharedMemoryServer(Path("failed_pieces_server.log"));
  ASSERT_NE(port, 0) << ReadFile(process.log);
  SharedMemoryServer shm(process, port);
  SharedMemoryTransport transport(shm.client(), SharedMemoryTransport::Bounded(8192));
  v1::UploadHeader header;
  header.mutable_create()->set_name("half");
  header.mutable_create()->set_dtype(v1::DTYPE_BOOL);
  header.mutable_create()->add_shape(20000);
  uint64_t given = 0;
  UploadReader reader = [&](std::span<std::byte> out) -> absl::StatusOr<size_t> {
    if (given >= 10000) return absl::DataLossError("the file ended early");
    std::memset(out.data(), 1, out.size());
    given += out.size();
    return out.size();
  };
  absl::StatusOr<v1::CopyRegionResponse> response = transport.Upload(header, 20000, reader);
  EXPECT_EQ(response.status(), absl::DataLossError("the file ended early"));
  EXPECT_EQ(transport.region_bytes(), 8192u);
  absl::StatusOr<v1::ListBuffersResponse> list = shm.client().ListBuffers();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->buffers_size(), 0);
  absl::StatusOr<v1::ServerInfo> info = shm.client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->memory_used_bytes(), 0u);
  ExpectStopsCleanly(shm.process(), SIGTERM);
}

// ParallelCopy against memcpy: several threads, destinations at every alignment to the
// 16 bytes its stores want, and sizes that end mid-line and mid-page.
TEST(ParallelCopyTest, CopiesEveryByteAtAnyAlignment) {
  const size_t bytes = (size_t{9} << 20) + 4099;
  std::string source(bytes + 64, '\0');
  std::mt19937 random(40);
  for (char& c : source) c = static_cast<char>(random());
  for (const size_t dst_offset : {0, 1, 7, 15, 16, 33}) {
    for (const size_t src_offset : {0, 3}) {
      for (const size_t n : {bytes, bytes - 4099, size_t{100}}) {
        SCOPED_TRACE(absl::StrCat(dst_offset, " ", src_offset, " ", n));
        std::string out(bytes + 64, '\x5a');
        ParallelCopy(out.data() + dst_offset, source.data() + src_offset, n);
        std::string expected(bytes + 64, '\x5a');
        std::memcpy(expected.data() + dst_offset, source.data() + src_offset, n);
        EXPECT_TRUE(out == expected);
      }
    }
  }
}

class SharedMemoryKillTest : public CliTest {
 protected:
  // Kills shared-memory puts of a 32 MiB array at several moments of the transfer, with
  // a segment that holds the whole array (`whole_segment`: the put is one copy, all or
  // nothing) or the default one, smaller (the put creates the buffer and fills it piece
  // by piece, under a lease until the last piece is in); then expects the server to stop
  // cleanly on SIGTERM, within its grace.
  void KillPutsMidway(bool whole_segment) {
    const size_t n = size_t{4} << 20;  // 32 MiB
    const std::vector<double> values = RandomValues(n, 13);
    const std::string in = Path("killed_in.npy");
    WriteNpy(in, values, {n}, false);
    ServerProcess process =
        SpawnServer({"--listen=127.0.0.1:0", "--backend=cpu", "--memory-limit=1GiB",
                     "--cpu-threads=2", "--allow-shared-memory", "--region-idle-timeout=0.3"},
                    Path("killed_server.log"));
    const int port = WaitForListening(process);
    ASSERT_NE(port, 0) << ReadFile(process.log);
    SharedMemoryServer shm(process, port);

    // A round whose every kill came too late (the put had finished: a loaded machine, or
    // a slow poll of the regions) tested nothing; up to three rounds are run until one
    // kill lands mid-transfer.
    constexpr int kDelays = 4;
    int whole = 0;  // kills that came too late, in the last round
    for (int round = 0; round < 3 && (round == 0 || whole == kDelays); ++round) {
      whole = 0;
      for (const int delay_ms : {0, 5, 20, 60}) {
        SCOPED_TRACE(absl::StrCat("killed ", delay_ms, " ms after registering",
                                  whole_segment ? ", one segment" : ", in pieces", ", round ",
                                  round));
        const std::string name = absl::StrCat("killed_", delay_ms, "_", round,
                                              whole_segment ? "_whole" : "_pieces");
        std::vector<std::string> flags = {"--server", shm.target(), "--client",
                                          "cli-test", "put",        in,
                                          "--name",   name,         "--transport=shm"};
        if (whole_segment) flags.push_back("--shm-segment=32MiB");
        ServerProcess cli = SpawnProgram(cli_bin_, flags, Path("killed_cli.log"));
        ASSERT_GT(cli.pid, 0);
        // Mid-transfer: the region is registered and the segment's name already unlinked.
        for (const absl::Time deadline = absl::Now() + absl::Seconds(20);
             absl::Now() < deadline && !HasExited(cli.pid);) {
          if (shm.Regions() == 1 && !ShmFileOf(cli.pid)) break;
          absl::SleepFor(absl::Microseconds(200));
        }
        absl::SleepFor(absl::Milliseconds(delay_ms));
        kill(cli.pid, SIGKILL);
        int status = 0;
        waitpid(cli.pid, &status, 0);

        // The region idles out and the server unmaps it; no file is left in /dev/shm.
        for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
             absl::Now() < deadline && shm.Regions() != 0;) {
          absl::SleepFor(absl::Milliseconds(20));
        }
        EXPECT_EQ(shm.Regions(), 0);
        EXPECT_FALSE(MapsSegmentOf(process.pid, cli.pid)) << "the server still maps the segment";
        EXPECT_FALSE(ShmFileOf(cli.pid)) << "a segment file is left in /dev/shm";
        // The buffer exists whole, with every value and no lease, or not at all; or, put in
        // pieces, part written under the upload's lease. Memory matches.
        absl::StatusOr<v1::ListBuffersResponse> list = shm.client().ListBuffers();
        ASSERT_TRUE(list.ok()) << list.status();
        for (const v1::BufferInfo& buffer : list->buffers()) {
          if (buffer.name() != name) continue;
          std::string bytes;
          v1::DownloadRequest request;
          request.set_buffer(buffer.id());
          ASSERT_TRUE(shm.client().Download(request, &bytes).ok());
          ASSERT_EQ(bytes.size(), n * 8);
          if (buffer.ttl_seconds() == 0) {
            ++whole;
            EXPECT_EQ(std::memcmp(bytes.data(), values.data(), bytes.size()), 0)
                << "a half-written buffer is visible without a lease";
          } else {
            EXPECT_FALSE(whole_segment) << "a buffer put in one upload has a lease";
            EXPECT_EQ(buffer.ttl_seconds(), kUploadLeaseSeconds);
          }
        }
        absl::StatusOr<v1::ServerInfo> info = shm.client().GetServerInfo();
        ASSERT_TRUE(info.ok());
        EXPECT_EQ(info->memory_used_bytes(), list->total_bytes()) << "memory leaked";
      }
    }
    EXPECT_LT(whole, kDelays) << "no kill came mid-transfer, so this test tested nothing";
    ExpectStopsCleanly(shm.process(), SIGTERM);
  }
};

TEST_F(SharedMemoryKillTest, ClientKilledDuringASharedMemoryPutLeavesNothing) {
  KillPutsMidway(/*whole_segment=*/true);
}

TEST_F(SharedMemoryKillTest, ClientKilledDuringASharedMemoryPutInPiecesLeavesALeasedBuffer) {
  KillPutsMidway(/*whole_segment=*/false);
}

// The rows of a `--json bench` document: its "results" list, parsed by protobuf's JSON
// parser (a real one, not a search for substrings).
std::vector<google::protobuf::Struct> BenchResults(const std::string& json,
                                                   google::protobuf::Struct* document) {
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, document).ok()) << json;
  std::vector<google::protobuf::Struct> rows;
  for (const google::protobuf::Value& row :
       (*document->mutable_fields())["results"].list_value().values()) {
    rows.push_back(row.struct_value());
  }
  return rows;
}

double Number(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  EXPECT_TRUE(it != s.fields().end() && it->second.has_number_value()) << key;
  return it == s.fields().end() ? 0 : it->second.number_value();
}

std::string Text(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? "" : it->second.string_value();
}

TEST_F(CliTest, BenchPrintsEachTransportAndSizeBesideTheServersCeiling) {
  absl::StatusOr<std::unique_ptr<Client>> client = [] {
    ClientOptions options;
    options.target = "127.0.0.1:" + std::to_string(port_);
    options.client_name = "cli-test";
    return Client::Connect(options);
  }();
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::ServerInfo> before = (*client)->GetServerInfo();
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_GT(before->host_to_device_gbps(), 0) << "the server measured no ceiling";

  // The table: a header, then one row per transport and size; shared memory is not
  // allowed by this server, so it has no row.
  Result table = Run("bench --sizes=64KiB,1MiB --repeat 2 --streams 3 --chunk-bytes=256KiB");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  std::map<std::string, int> rows;  // "transport streams size" -> count
  for (absl::string_view line : absl::StrSplit(table.out, '\n')) {
    std::vector<absl::string_view> cells = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (cells.size() < 8 || (cells[0] != "grpc" && cells[0] != "grpc-parallel")) continue;
    ++rows[absl::StrCat(cells[0], " ", cells[1], " ", cells[2], " ", cells[3])];
    for (size_t i : {4, 5, 6, 7}) {
      double value = 0;
      EXPECT_TRUE(absl::SimpleAtod(cells[i], &value) && std::isfinite(value) && value > 0) << line;
    }
  }
  const std::map<std::string, int> expected = {{"grpc 1 65.5 kB", 1},
                                               {"grpc 1 1.0 MB", 1},
                                               {"grpc-parallel 3 65.5 kB", 1},
                                               {"grpc-parallel 3 1.0 MB", 1}};
  EXPECT_EQ(rows, expected) << table.out;
  EXPECT_NE(table.out.find("vs h2d"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("shm: not usable"), std::string::npos) << table.out;

  // The same as one JSON document, every ratio finite and positive and consistent with
  // the server's ceiling.
  Result json = Run("--json bench --sizes=1MiB,64KiB --repeat 1 --transport=grpc,grpc-parallel");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(std::count(json.out.begin(), json.out.end(), '\n'), 1) << json.out;
  google::protobuf::Struct document;
  const std::vector<google::protobuf::Struct> results = BenchResults(json.out, &document);
  EXPECT_EQ(Number(document, "repeat"), 1);
  EXPECT_EQ(Number(document, "chunk_bytes"), 4 << 20);
  ASSERT_EQ(results.size(), 4u) << json.out;
  const google::protobuf::Struct& ceiling = document.fields().at("ceiling").struct_value();
  EXPECT_NEAR(Number(ceiling, "host_to_device_gbps"), before->host_to_device_gbps(),
              before->host_to_device_gbps() * 1e-8);
  EXPECT_NEAR(Number(ceiling, "device_to_host_gbps"), before->device_to_host_gbps(),
              before->device_to_host_gbps() * 1e-8);
  const std::vector<std::pair<std::string, double>> order = {{"grpc", 1 << 20},
                                                             {"grpc-parallel", 1 << 20},
                                                             {"grpc", 64 << 10},
                                                             {"grpc-parallel", 64 << 10}};
  for (size_t i = 0; i < results.size(); ++i) {
    const google::protobuf::Struct& r = results[i];
    SCOPED_TRACE(json.out);
    EXPECT_EQ(Text(r, "transport"), order[i].first);
    EXPECT_EQ(Number(r, "size_bytes"), order[i].second);
    EXPECT_EQ(Number(r, "streams"), order[i].first == "grpc" ? 1 : kAutoUploadStreams);
    for (const char* way : {"upload", "download"}) {
      const double seconds = Number(r, absl::StrCat(way, "_seconds"));
      const double gbps = Number(r, absl::StrCat(way, "_gbps"));
      const double ratio = Number(r, absl::StrCat(way, "_vs_ceiling"));
      ASSERT_TRUE(std::isfinite(ratio) && ratio > 0) << way;
      EXPECT_NEAR(gbps, order[i].second / seconds / 1e9, gbps * 1e-4) << way;
      const double ceiling_gbps = std::string(way) == "upload" ? before->host_to_device_gbps()
                                                               : before->device_to_host_gbps();
      EXPECT_NEAR(ratio, gbps / ceiling_gbps, ratio * 1e-4) << way;
    }
  }

  // Bad flags: exit 2 with a message naming the flag, and nothing uploaded.
  for (const auto& [flags, message] :
       std::vector<std::pair<std::string, std::string>>{{"--sizes=12", "--sizes"},
                                                        {"--sizes=1MiB,lots", "--sizes"},
                                                        {"--sizes=-8", "--sizes"},
                                                        {"--repeat 0", "--repeat"},
                                                        {"--repeat=x", "--repeat"},
                                                        {"--transport=pigeon", "--transport"},
                                                        {"--chunk-bytes=16", "--chunk-bytes"},
                                                        {"--chunk-bytes=1GiB", "--chunk-bytes"},
                                                        {"--streams=1", "--streams"},
                                                        {"--frobnicate", "--frobnicate"},
                                                        {"extra", "extra"}}) {
    Result bad = Run("bench " + flags);
    EXPECT_EQ(bad.exit_code, 2) << flags << ": " << bad.err;
    EXPECT_NE(bad.err.find(message), std::string::npos) << flags << ": " << bad.err;
    EXPECT_TRUE(bad.out.empty()) << flags << ": " << bad.out;
  }
  // Shared memory asked for from a server that does not allow it: its error, not a usage one.
  Result shm = Run("bench --sizes=64KiB --repeat 1 --transport=shm");
  EXPECT_EQ(shm.exit_code, 19) << shm.err;
  EXPECT_NE(shm.err.find("--allow-shared-memory"), std::string::npos) << shm.err;

  // Every buffer the runs made is gone.
  absl::StatusOr<v1::ServerInfo> after = (*client)->GetServerInfo();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->buffer_count(), before->buffer_count());
  EXPECT_EQ(after->memory_used_bytes(), before->memory_used_bytes());
}

// --latency N times N Submit(wait) round trips of the smallest operation and reports their
// p50 and p99, in the table and in the JSON document; the operations run on the server.
TEST_F(CliTest, BenchTimesSubmitWaitLatency) {
  ClientOptions options;
  options.target = "127.0.0.1:" + std::to_string(port_);
  options.client_name = "cli-test";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::Stats> before = (*client)->GetStats();
  ASSERT_TRUE(before.ok()) << before.status();
  absl::StatusOr<v1::ServerInfo> info = (*client)->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();

  Result json = Run("--json bench --sizes=64KiB --repeat 1 --transport=grpc --latency 50");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  google::protobuf::Struct document;
  BenchResults(json.out, &document);
  ASSERT_TRUE(document.fields().contains("latency")) << json.out;
  const google::protobuf::Struct& latency = document.fields().at("latency").struct_value();
  EXPECT_EQ(Number(latency, "calls"), 50);
  const double p50 = Number(latency, "p50_us");
  const double p99 = Number(latency, "p99_us");
  EXPECT_GT(p50, 0);
  EXPECT_GE(p99, p50);
  absl::StatusOr<v1::Stats> after = (*client)->GetStats();
  ASSERT_TRUE(after.ok()) << after.status();
  uint64_t elementwise = 0;
  for (const auto& kind : after->kinds()) {
    if (kind.kind() == v1::OPERATION_KIND_ELEMENTWISE) elementwise += kind.count();
  }
  for (const auto& kind : before->kinds()) {
    if (kind.kind() == v1::OPERATION_KIND_ELEMENTWISE) elementwise -= kind.count();
  }
  EXPECT_EQ(elementwise, 60u) << "50 timed and 10 warm-up operations";

  Result table = Run("bench --sizes=64KiB --repeat 1 --transport=grpc --latency 20");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("Submit(wait) of x + 1 on one element, 20 calls: p50 "),
            std::string::npos)
      << table.out;
  // Without --latency, no line and no calls.
  Result none = Run("--json bench --sizes=64KiB --repeat 1 --transport=grpc");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_NE(none.out.find("\"latency\":{\"calls\":0,"), std::string::npos) << none.out;

  for (const std::string flag : {"--latency -1", "--latency 100001", "--latency x"}) {
    Result bad = Run("bench --sizes=64KiB " + flag);
    EXPECT_EQ(bad.exit_code, 2) << flag << ": " << bad.err;
    EXPECT_NE(bad.err.find("--latency"), std::string::npos) << flag << ": " << bad.err;
    EXPECT_TRUE(bad.out.empty()) << flag;
  }
  absl::StatusOr<v1::ServerInfo> later = (*client)->GetServerInfo();
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->buffer_count(), info->buffer_count()) << "the latency buffer is deleted";
}

TEST_F(CliTest, BenchUsesSharedMemoryWhereTheServerAllowsIt) {
  auto [process, port] = SpawnSharedMemoryServer(Path("bench_shm_server.log"));
  ASSERT_NE(port, 0) << ReadFile(process.log);
  SharedMemoryServer shm(process, port);
  Result json = Run("--json bench --sizes=256KiB --repeat 1", shm.target());
  ASSERT_EQ(json.exit_code, 0) << json.err;
  google::protobuf::Struct document;
  const std::vector<google::protobuf::Struct> results = BenchResults(json.out, &document);
  ASSERT_EQ(results.size(), 4u) << json.out;
  EXPECT_EQ(Text(results[2], "transport"), "shm");
  EXPECT_EQ(Text(results[3], "transport"), "shm-inplace");
  for (const auto& result : {results[2], results[3]}) {
    for (const char* key : {"upload_vs_ceiling", "download_vs_ceiling"}) {
      const double ratio = Number(result, key);
      EXPECT_TRUE(std::isfinite(ratio) && ratio > 0) << key << ": " << json.out;
    }
  }
  EXPECT_EQ(shm.Regions(), 0) << "bench left its region registered";
  absl::StatusOr<v1::ServerInfo> info = shm.client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->buffer_count(), 0u);
  ExpectStopsCleanly(shm.process(), SIGTERM);
}

// The CLI reads sizes as the server reads its flags (common/byte_size.h): against a
// server started with --memory-limit=1G (10^9 bytes), bench --sizes 1G fits exactly,
// while 1Gi (2^30 bytes) is the server's to refuse, and a size that is no whole number
// of bytes is the CLI's.
TEST_F(CliTest, BenchSizesReadAsTheServerReadsItsMemoryLimit) {
  ServerProcess process =
      SpawnServer({"--listen=127.0.0.1:0", "--backend=cpu", "--memory-limit=1G", "--cpu-threads=2"},
                  Path("bench_1g_server.log"));
  const int port = WaitForListening(process);
  ASSERT_NE(port, 0) << ReadFile(process.log);
  const std::string target = "127.0.0.1:" + std::to_string(port);

  Result fits = Run("--json bench --sizes 1G --repeat 1 --transport grpc", target);
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  google::protobuf::Struct document;
  const std::vector<google::protobuf::Struct> results = BenchResults(fits.out, &document);
  ASSERT_EQ(results.size(), 1u) << fits.out;
  EXPECT_EQ(Number(results[0], "size_bytes"), 1e9);

  Result binary = Run("bench --sizes 1Gi --repeat 1 --transport grpc", target);
  EXPECT_EQ(binary.exit_code, 18) << "RESOURCE_EXHAUSTED is 10 + 8: " << binary.err;

  Result fraction = Run("bench --sizes 0.1Ki --transport grpc", target);
  EXPECT_EQ(fraction.exit_code, 2) << fraction.err;
  EXPECT_NE(fraction.err.find("--sizes: '0.1Ki' is not a byte size: it is not a whole number of "
                              "bytes"),
            std::string::npos)
      << fraction.err;
  ExpectStopsCleanly(process, SIGTERM);
}

// ---------------------------------------------------------------------------
// Authentication: the program's flags, SIGHUP and the CLI's token.

// Waits until `log` holds `text`, up to 10 s.
bool LogSays(const ServerProcess& server, const std::string& text) {
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
    std::ifstream in(server.log, std::ios::binary);
    if (std::string(std::istreambuf_iterator<char>(in), {}).find(text) != std::string::npos)
      return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

TEST_F(CliTest, TokensFileIsReloadedOnSighup) {
  const std::string tokens = Path("tokens");
  std::ofstream(tokens, std::ios::trunc) << "first-token-41 alice\n";
  ServerProcess server =
      SpawnServer({"--listen=127.0.0.1:0", "--backend=cpu", "--memory-limit=64MiB",
                   "--cpu-threads=1", "--tokens-file=" + tokens},
                  Path("auth-server.log"));
  const int port = WaitForListening(server);
  ASSERT_NE(port, 0) << ReadFile(server.log);
  const std::string target = "127.0.0.1:" + std::to_string(port);

  Result good = Run("--token first-token-41 --json info", target);
  ASSERT_EQ(good.exit_code, 0) << good.err;
  EXPECT_EQ(ParseJson<v1::ServerInfo>(good.out).tenant(), "alice");
  Result none = Run("info", target);
  EXPECT_EQ(none.exit_code, 10 + static_cast<int>(absl::StatusCode::kUnauthenticated)) << none.err;
  EXPECT_NE(none.err.find("UNAUTHENTICATED"), std::string::npos) << none.err;

  // The file changes; SIGHUP makes the server read it.
  std::ofstream(tokens, std::ios::trunc) << "second-token-42 bob admin\n";
  ASSERT_EQ(kill(server.pid, SIGHUP), 0);
  ASSERT_TRUE(LogSays(server, "reloaded the tokens file: 1 tokens")) << ReadFile(server.log);
  Result old_token = Run("--token first-token-41 info", target);
  EXPECT_EQ(old_token.exit_code, 10 + static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(old_token.err.find("first-token-41"), std::string::npos) << old_token.err;
  // $GPUCOMPUTE_TOKEN and --token-file carry a token too.
  setenv("GPUCOMPUTE_TOKEN", "second-token-42", 1);
  Result from_env = Run("--json info", target);
  unsetenv("GPUCOMPUTE_TOKEN");
  ASSERT_EQ(from_env.exit_code, 0) << from_env.err;
  EXPECT_EQ(ParseJson<v1::ServerInfo>(from_env.out).tenant(), "bob");
  std::ofstream(Path("token"), std::ios::trunc) << "second-token-42\n";
  Result from_file = Run("--token-file " + ShellQuote(Path("token")) + " --json info", target);
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_TRUE(ParseJson<v1::ServerInfo>(from_file.out).admin());

  // A malformed file keeps the tokens in use, and the log does not quote it.
  std::ofstream(tokens, std::ios::trunc) << "third-token-43\n";
  ASSERT_EQ(kill(server.pid, SIGHUP), 0);
  ASSERT_TRUE(LogSays(server, "kept the tokens in use")) << ReadFile(server.log);
  EXPECT_EQ(ReadFile(server.log).find("third-token-43"), std::string::npos);
  EXPECT_EQ(ReadFile(server.log).find("second-token-42"), std::string::npos);
  EXPECT_EQ(Run("--token second-token-42 info", target).exit_code, 0);
  EXPECT_NE(Run("--token third-token-43 info", target).exit_code, 0);
  ExpectStopsCleanly(server, SIGTERM);
}

TEST_F(CliTest, NonLoopbackListenNeedsAuthenticationOrTheFlag) {
  ServerProcess refused =
      SpawnServer({"--listen=0.0.0.0:0", "--backend=cpu"}, Path("insecure-server.log"));
  int status = 0;
  ASSERT_EQ(waitpid(refused.pid, &status, 0), refused.pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(ReadFile(refused.log).find("--allow-insecure-remote"), std::string::npos)
      << ReadFile(refused.log);

  ServerProcess allowed =
      SpawnServer({"--listen=0.0.0.0:0", "--backend=cpu", "--memory-limit=64MiB", "--cpu-threads=1",
                   "--allow-insecure-remote"},
                  Path("allowed-server.log"));
  ASSERT_NE(WaitForListening(allowed), 0) << ReadFile(allowed.log);
  ExpectStopsCleanly(allowed, SIGTERM);
}

// ---------------------------------------------------------------------------
// Views, broadcasting, reductions over axes and of expressions, matmul

// Values 0, 1, 2, ... of `shape` in C order.
std::vector<double> Iota(size_t n) {
  std::vector<double> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<double>(i);
  return values;
}

// A malformed view, flag or kind is a usage error (exit 2) naming the problem, and
// nothing reaches the server: no buffer, no file.
TEST_F(CliTest, ViewSyntaxAndTheNewFlagsAreCheckedBeforeAnythingIsSent) {
  ASSERT_EQ(Run("create --shape 4,6 --name vs_x").exit_code, 0);
  const std::string file = Path("vs_never.npy");
  Result get = Run("get " + ShellQuote("vs_x[0") + " -o " + ShellQuote(file));
  EXPECT_EQ(get.exit_code, 2);
  EXPECT_NE(get.err.find("gpucompute: get: in 'vs_x[0' at position 7: expected ',' or ']', "
                         "found the end"),
            std::string::npos)
      << get.err;
  EXPECT_FALSE(std::filesystem::exists(file));

  struct Case {
    std::string args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"eval 'x + 1' 'x=vs_x[::0]' --name vs_never",
       "in 'vs_x[::0]' at position 8: expected a nonzero slice step, found '0'"},
      {"eval 'x + 1' x=vs_x --out 'vs_x.T.foo'",
       "in 'vs_x.T.foo' at position 8: expected '[', '.T' or a method"},
      {"reduce median vs_x",
       "unknown reduction 'median' (sum prod min max mean norm2 argmin argmax var std any all)"},
      {"reduce sum vs_x --ddof 1", "--ddof applies to var and std only"},
      {"reduce sum vs_x --axis 0,x",
       "--axis needs an axis or a comma-separated list of them, e.g. 0,2, not '0,x'"},
      {"reduce sum 'x*y' x=vs_x y", "'y' is not NAME=VALUE"},
      {"reduce sum vs_x 'vs_x.reshape(2 3)'", "'vs_x.reshape(2 3)' is not NAME=VALUE"},
      {"matmul vs_x 'vs_x.transpose(1, 0' --name vs_never",
       "in 'vs_x.transpose(1, 0' at position 20: expected ',' or ')', found the end"},
      {"matmul vs_x vs_x --beta 1", "--beta scales an existing C: give it with --out"},
      {"gemv 'vs_x[' vs_x", "in 'vs_x[' at position 6: expected an integer, a slice"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    Result r = Run(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
  Result ls = Run("--json ls");
  EXPECT_EQ(ls.out.find("vs_never"), std::string::npos) << ls.out;
  EXPECT_EQ(Run("rm vs_x").exit_code, 0);
}

// get of a view writes the view's shape and its elements in C order, whatever the
// buffer's layout and the view's strides.
TEST_F(CliTest, GetDownloadsAViewInItsShape) {
  // x[i][j] = 6i + j, stored in C order and in F order.
  std::vector<double> f_order(24);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 6; ++j) f_order[j * 4 + i] = 6 * i + j;
  }
  WriteNpy(Path("gv_c.npy"), Iota(24), {4, 6}, false);
  WriteNpy(Path("gv_f.npy"), f_order, {4, 6}, true);
  ASSERT_EQ(Run("put " + ShellQuote(Path("gv_c.npy")) + " --name gv_c").exit_code, 0);
  ASSERT_EQ(Run("put " + ShellQuote(Path("gv_f.npy")) + " --name gv_f").exit_code, 0);
  struct Case {
    std::string view;
    std::vector<uint64_t> shape;
    std::vector<double> values;
  };
  const std::vector<Case> cases = {
      {"[::2].T", {6, 2}, {0, 12, 1, 13, 2, 14, 3, 15, 4, 16, 5, 17}},
      {"[-1, ::-2]", {3}, {23, 21, 19}},
      {"[1:3, None, 4:]", {2, 1, 2}, {10, 11, 16, 17}},
      {"[2].reshape(3, -1)", {3, 2}, {12, 13, 14, 15, 16, 17}},
      {"[0, 0:3].broadcast_to(2, 3)", {2, 3}, {0, 1, 2, 0, 1, 2}},
      {".T[5].expand_dims(0)", {1, 4}, {5, 11, 17, 23}},
      {"[..., 0]", {4}, {0, 6, 12, 18}},
  };
  for (const char* buffer : {"gv_c", "gv_f"}) {
    for (const Case& c : cases) {
      const std::string ref = absl::StrCat(buffer, c.view);
      SCOPED_TRACE(ref);
      const std::string out = Path("gv_out.npy");
      Result get = Run("get " + ShellQuote(ref) + " -o " + ShellQuote(out));
      ASSERT_EQ(get.exit_code, 0) << get.err;
      NpyHeader header;
      EXPECT_EQ(ReadNpyDoubles(out, &header), c.values);
      EXPECT_EQ(header.shape, c.shape);
      EXPECT_FALSE(header.fortran_order);
    }
  }
  // A view that does not apply: INVALID_ARGUMENT naming the step, and no file.
  Result bad = Run("get " + ShellQuote("gv_c[4]") + " -o " + ShellQuote(Path("gv_bad.npy")));
  EXPECT_EQ(bad.exit_code, 13) << bad.err;
  EXPECT_NE(bad.err.find("index 4 is out of range for axis 0 of length 4"), std::string::npos)
      << bad.err;
  EXPECT_FALSE(std::filesystem::exists(Path("gv_bad.npy")));
}

// eval reads views and broadcasts its operands, and writes through a view with --out.
TEST_F(CliTest, EvalBroadcastsAndWritesThroughAView) {
  WriteNpy(Path("eb_m.npy"), {1, 2, 3}, {3, 1}, false);
  WriteNpy(Path("eb_r.npy"), {10, 20, 30, 40}, {4}, false);
  ASSERT_EQ(Run("put " + ShellQuote(Path("eb_m.npy")) + " --name eb_m").exit_code, 0);
  ASSERT_EQ(Run("put " + ShellQuote(Path("eb_r.npy")) + " --name eb_r").exit_code, 0);
  Result sum = Run("eval 'm + r' m=eb_m r=eb_r --name eb_s");
  ASSERT_EQ(sum.exit_code, 0) << sum.err;
  // r as (2, 2), doubled, into rows 0 and 2 and columns 3 and 1.
  Result through = Run("eval 'x * 2' 'x=eb_r.reshape(2, 2)' --out 'eb_s[::2, ::-2]'");
  ASSERT_EQ(through.exit_code, 0) << through.err;
  const std::vector<double> written = {11, 40, 31, 20, 12, 22, 32, 42, 13, 80, 33, 60};
  ASSERT_EQ(Run("get eb_s -o " + ShellQuote(Path("eb_s.npy"))).exit_code, 0);
  NpyHeader header;
  EXPECT_EQ(ReadNpyDoubles(Path("eb_s.npy"), &header), written);
  EXPECT_EQ(header.shape, (std::vector<uint64_t>{3, 4}));
  // An output that overlaps an input only partly (even columns into odd ones) is the
  // server's INVALID_ARGUMENT, and writes nothing.
  Result partial = Run("eval 'x * 2' 'x=eb_s[:, ::2]' --out 'eb_s[:, 1::2]'");
  EXPECT_EQ(partial.exit_code, 13) << partial.err;
  ASSERT_EQ(Run("get eb_s -o " + ShellQuote(Path("eb_s2.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("eb_s2.npy")), written);
  // A view operand and a 0-d view (a row's element) against a row.
  Result view_ops = Run("eval 'a - b' 'a=eb_r[::-1]' 'b=eb_m[2, 0]' --name eb_v");
  ASSERT_EQ(view_ops.exit_code, 0) << view_ops.err;
  ASSERT_EQ(Run("get eb_v -o " + ShellQuote(Path("eb_v.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("eb_v.npy")), (std::vector<double>{37, 27, 17, 7}));
  // Shapes that do not broadcast: the server's INVALID_ARGUMENT, nothing created.
  Result bad = Run("eval 'x + y' x=eb_r 'y=eb_m.T' --name eb_never");
  EXPECT_EQ(bad.exit_code, 13) << bad.err;
  EXPECT_EQ(Run("--json ls").out.find("eb_never"), std::string::npos);
}

// eval --shape: an expression with no buffer (arange, eye), and a buffer broadcast to a
// larger shape; a shape the buffer does not broadcast to is the server's INVALID_ARGUMENT.
TEST_F(CliTest, EvalWithAShapeMakesArraysWithoutAnUpload) {
  Result arange = Run("eval 'float64(index(0)) * 0.5' --shape 5 --name es_a");
  ASSERT_EQ(arange.exit_code, 0) << arange.err;
  ASSERT_EQ(Run("get es_a -o " + ShellQuote(Path("es_a.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("es_a.npy")), (std::vector<double>{0, 0.5, 1, 1.5, 2}));
  Result eye = Run("eval 'where(index(0) == index(1), 1.0, 0.0)' --shape 2,3 --name es_e");
  ASSERT_EQ(eye.exit_code, 0) << eye.err;
  ASSERT_EQ(Run("get es_e -o " + ShellQuote(Path("es_e.npy"))).exit_code, 0);
  NpyHeader header;
  EXPECT_EQ(ReadNpyDoubles(Path("es_e.npy"), &header), (std::vector<double>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(header.shape, (std::vector<uint64_t>{2, 3}));
  Result rows = Run("eval 'x + index(0)' x=es_a --shape 2,5 --name es_r");
  ASSERT_EQ(rows.exit_code, 0) << rows.err;
  ASSERT_EQ(Run("get es_r -o " + ShellQuote(Path("es_r.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("es_r.npy")),
            (std::vector<double>{0, 0.5, 1, 1.5, 2, 1, 1.5, 2, 2.5, 3}));
  Result bad = Run("eval 'x + 1' x=es_a --shape 5,2 --name es_never");
  EXPECT_EQ(bad.exit_code, 13) << bad.err;
  EXPECT_NE(bad.err.find("does not broadcast to the requested shape (5,2)"), std::string::npos)
      << bad.err;
  EXPECT_EQ(Run("--json ls").out.find("es_never"), std::string::npos);
}

// reduce over axis lists with --keepdims and --ddof, the new kinds, a view input and
// an expression, against values computed here.
TEST_F(CliTest, ReduceOverAxesOfViewsAndExpressions) {
  const std::vector<double> x = RandomValues(2 * 3 * 4, 11);
  auto at = [&](int i, int j, int k) { return x[(i * 3 + j) * 4 + k]; };
  WriteNpy(Path("rx.npy"), x, {2, 3, 4}, false);
  ASSERT_EQ(Run("put " + ShellQuote(Path("rx.npy")) + " --name rdx").exit_code, 0);

  Result var = Run("--json reduce var rdx --axis 0,2 --keepdims --ddof 1 --name rd_var");
  ASSERT_EQ(var.exit_code, 0) << var.err;
  v1::Operation op = ParseJson<v1::Operation>(var.out);
  ASSERT_EQ(op.values_size(), 3);
  ASSERT_EQ(op.outputs_size(), 1);
  EXPECT_EQ(std::vector<uint64_t>(op.outputs(0).shape().begin(), op.outputs(0).shape().end()),
            (std::vector<uint64_t>{1, 3, 1}));
  for (int j = 0; j < 3; ++j) {
    double mean = 0;
    for (int i = 0; i < 2; ++i) {
      for (int k = 0; k < 4; ++k) mean += at(i, j, k) / 8;
    }
    double squares = 0;
    for (int i = 0; i < 2; ++i) {
      for (int k = 0; k < 4; ++k) squares += (at(i, j, k) - mean) * (at(i, j, k) - mean);
    }
    EXPECT_NEAR(op.values(j).float_value(), squares / 7, 1e-12) << j;
  }

  // max over the last axis of a view: x[:, ::-1, 1:].
  Result max = Run("--json reduce max 'rdx[:, ::-1, 1:]' --axis -1");
  ASSERT_EQ(max.exit_code, 0) << max.err;
  op = ParseJson<v1::Operation>(max.out);
  ASSERT_EQ(op.values_size(), 6);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      const double want = std::max({at(i, 2 - j, 1), at(i, 2 - j, 2), at(i, 2 - j, 3)});
      EXPECT_EQ(op.values(i * 3 + j).float_value(), want) << i << "," << j;
    }
  }

  // sum(x * y) with y = x[0] broadcast against x, in one pass.
  Result dot = Run("--json reduce sum 'x*y' x=rdx 'y=rdx[0]'");
  ASSERT_EQ(dot.exit_code, 0) << dot.err;
  op = ParseJson<v1::Operation>(dot.out);
  double want = 0;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) want += at(i, j, k) * at(0, j, k);
    }
  }
  ASSERT_EQ(op.values_size(), 1);
  EXPECT_NEAR(op.values(0).float_value(), want, 1e-12 * std::abs(want));

  bool any = false;
  bool all = true;
  for (double v : x) {
    any = any || v > 2.5;
    all = all && v > -3;
  }
  Result any_op = Run("--json reduce any 'x > 2.5' x=rdx");
  ASSERT_EQ(any_op.exit_code, 0) << any_op.err;
  op = ParseJson<v1::Operation>(any_op.out);
  ASSERT_EQ(op.values_size(), 1);
  EXPECT_EQ(op.values(0).bool_value(), any);
  Result all_op = Run("--json reduce all 'x > -3' x=rdx");
  ASSERT_EQ(all_op.exit_code, 0) << all_op.err;
  op = ParseJson<v1::Operation>(all_op.out);
  ASSERT_EQ(op.values_size(), 1);
  EXPECT_EQ(op.values(0).bool_value(), all);

  // std of one column over the rows, NumPy's ddof 0.
  Result std_op = Run("--json reduce std 'rdx[1, :, 2]'");
  ASSERT_EQ(std_op.exit_code, 0) << std_op.err;
  op = ParseJson<v1::Operation>(std_op.out);
  const double m = (at(1, 0, 2) + at(1, 1, 2) + at(1, 2, 2)) / 3;
  double squares = 0;
  for (int j = 0; j < 3; ++j) squares += (at(1, j, 2) - m) * (at(1, j, 2) - m);
  ASSERT_EQ(op.values_size(), 1);
  EXPECT_NEAR(op.values(0).float_value(), std::sqrt(squares / 3), 1e-12);

  // A repeated axis: INVALID_ARGUMENT from the server, nothing created.
  Result bad = Run("reduce sum rdx --axis 1,-2 --name rd_never");
  EXPECT_EQ(bad.exit_code, 13) << bad.err;
  EXPECT_EQ(Run("--json ls").out.find("rd_never"), std::string::npos);
}

TEST_F(CliTest, MatmulMultipliesBuffersAndViews) {
  // A (2 x 3), B (3 x 4): A[i][k] = 3i + k, B[k][j] = 4k + j.
  WriteNpy(Path("mm_a.npy"), Iota(6), {2, 3}, false);
  WriteNpy(Path("mm_b.npy"), Iota(12), {3, 4}, false);
  ASSERT_EQ(Run("put " + ShellQuote(Path("mm_a.npy")) + " --name mm_a").exit_code, 0);
  ASSERT_EQ(Run("put " + ShellQuote(Path("mm_b.npy")) + " --name mm_b").exit_code, 0);
  std::vector<double> ab(8, 0);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      for (int k = 0; k < 3; ++k) ab[i * 4 + j] += (3 * i + k) * (4 * k + j);
    }
  }
  Result c = Run("--json matmul mm_a mm_b --name mm_c");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(ParseJson<v1::Operation>(c.out).kind(), v1::OPERATION_KIND_MATMUL);
  ASSERT_EQ(Run("get mm_c -o " + ShellQuote(Path("mm_c.npy"))).exit_code, 0);
  NpyHeader header;
  EXPECT_EQ(ReadNpyDoubles(Path("mm_c.npy"), &header), ab);
  EXPECT_EQ(header.shape, (std::vector<uint64_t>{2, 4}));

  // C = 2 * op(A.T) @ B + 0.5 * C, with A.T a view transposed back by --transpose-a.
  Result acc = Run("matmul 'mm_a.T' mm_b --transpose-a --alpha 2 --beta 0.5 --out mm_c");
  ASSERT_EQ(acc.exit_code, 0) << acc.err;
  ASSERT_EQ(Run("get mm_c -o " + ShellQuote(Path("mm_c2.npy"))).exit_code, 0);
  std::vector<double> want = ab;
  for (double& v : want) v *= 2.5;
  EXPECT_EQ(ReadNpyDoubles(Path("mm_c2.npy")), want);

  // A row of A (1-D, the result drops its axis) times columns 1 and 2 of B.
  Result row = Run("matmul 'mm_a[1]' 'mm_b[:, 1:3]' --name mm_r");
  ASSERT_EQ(row.exit_code, 0) << row.err;
  ASSERT_EQ(Run("get mm_r -o " + ShellQuote(Path("mm_r.npy"))).exit_code, 0);
  EXPECT_EQ(ReadNpyDoubles(Path("mm_r.npy"), &header), (std::vector<double>{ab[5], ab[6]}));
  EXPECT_EQ(header.shape, (std::vector<uint64_t>{2}));

  // Shapes that do not match: INVALID_ARGUMENT, nothing created.
  Result bad = Run("matmul mm_b mm_a --name mm_never");
  EXPECT_EQ(bad.exit_code, 13) << bad.err;
  EXPECT_EQ(Run("--json ls").out.find("mm_never"), std::string::npos);
}

// tenant export and import: two servers with the same tenant, the CLI between them.
class TenantMoveTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    std::ofstream(Path("move-tokens"), std::ios::trunc) << "move-token-7 carol\n";
    for (int i = 0; i < 2; ++i) {
      servers_[i] = SpawnServer({"--listen=127.0.0.1:0", "--backend=cpu", "--memory-limit=64MiB",
                                 "--cpu-threads=1", "--tokens-file=" + Path("move-tokens")},
                                Path(absl::StrCat("move-server-", i, ".log")));
      const int port = WaitForListening(servers_[i]);
      ASSERT_NE(port, 0) << ReadFile(servers_[i].log);
      targets_[i] = absl::StrCat("127.0.0.1:", port);
      ClientOptions options;
      options.target = targets_[i];
      options.client_name = "cli-test";
      options.token = "move-token-7";
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
      ASSERT_TRUE(client.ok()) << client.status();
      clients_[i] = *std::move(client);
    }
    std::error_code ec;
    std::filesystem::remove_all(Path("export"), ec);
  }

  void TearDown() override {
    for (ServerProcess& server : servers_) {
      if (server.pid > 0) StopServer(server, SIGTERM);
    }
  }

  // Runs the CLI as tenant carol against server `i`.
  Result RunOn(int i, const std::string& args) {
    return Run("--token move-token-7 " + args, targets_[i]);
  }

  // name -> (id, bytes) of every named buffer on server `i`, and the count of all.
  std::map<std::string, std::pair<std::string, std::string>> Contents(int i, int* all = nullptr) {
    std::map<std::string, std::pair<std::string, std::string>> out;
    absl::StatusOr<v1::ListBuffersResponse> list = clients_[i]->ListBuffers();
    EXPECT_TRUE(list.ok()) << list.status();
    if (!list.ok()) return out;
    if (all != nullptr) *all = list->buffers_size();
    for (const v1::BufferInfo& b : list->buffers()) {
      if (b.name().empty()) continue;
      v1::DownloadRequest request;
      request.set_buffer(b.id());
      std::string bytes;
      EXPECT_TRUE(clients_[i]->Download(request, &bytes).ok());
      out[b.name()] = {b.id(), bytes};
    }
    return out;
  }

  // Creates buffers of every dtype and both layouts on server 0, one of them unnamed.
  void Populate() {
    WriteNpy(Path("mv_c.npy"), RandomValues(6 * 7, 11), {6, 7}, false);
    WriteNpy(Path("mv_f.npy"), RandomValues(5 * 3, 12), {5, 3}, true);
    ASSERT_EQ(RunOn(0, "put " + ShellQuote(Path("mv_c.npy")) + " --name 'c order'").exit_code, 0);
    ASSERT_EQ(RunOn(0, "put " + ShellQuote(Path("mv_f.npy")) + " --name f_order --ttl 600")
                  .exit_code,
              0);
    ASSERT_EQ(RunOn(0, "rand integers --shape 9 --dtype int32 --low -5 --high 5 --seed 3 "
                       "--name ints")
                  .exit_code,
              0);
    ASSERT_EQ(RunOn(0, "create --shape 4,2 --dtype bool --fill True --name flags").exit_code, 0);
    ASSERT_EQ(RunOn(0, "create --shape '' --dtype int64 --fill 7 --name scalar").exit_code, 0);
    ASSERT_EQ(RunOn(0, "create --shape 3 --fill 1").exit_code, 0);  // unnamed
  }

  ServerProcess servers_[2];
  std::string targets_[2];
  std::unique_ptr<Client> clients_[2];
};

TEST_F(TenantMoveTest, ExportThenImportMovesEveryNamedBufferByteForByte) {
  Populate();
  int all = 0;
  const auto before = Contents(0, &all);
  ASSERT_EQ(before.size(), 5u);
  ASSERT_EQ(all, 6);

  Result exported = RunOn(0, "tenant export " + ShellQuote(Path("export")));
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_NE(exported.out.find("exported 5 named buffers"), std::string::npos) << exported.out;
  // Each file is what the server would persist: it decodes with the server's reader,
  // and its payload is the buffer's bytes.
  std::vector<std::string> manifest =
      absl::StrSplit(ReadFile(Path("export/MANIFEST")), '\n', absl::SkipEmpty());
  ASSERT_EQ(manifest.size(), 6u);
  EXPECT_EQ(manifest[0], "gpucompute-tenant-export 1");
  for (size_t i = 1; i < manifest.size(); ++i) {
    const std::string file_name = manifest[i].substr(0, manifest[i].find(' '));
    const std::string name = manifest[i].substr(file_name.size() + 1);
    ASSERT_TRUE(before.contains(name)) << manifest[i];
    EXPECT_EQ(file_name, before.at(name).first + ".gpcbuf");
    const std::string file = ReadFile(Path("export/" + file_name));
    absl::StatusOr<PersistedFile> decoded = DecodePersistFile(file);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->header.name, name);
    EXPECT_EQ(decoded->payload, before.at(name).second) << name;
  }

  Result imported = RunOn(1, "--json tenant import " + ShellQuote(Path("export")));
  ASSERT_EQ(imported.exit_code, 0) << imported.err;
  EXPECT_NE(imported.out.find("\"buffers\":5"), std::string::npos) << imported.out;
  int moved_all = 0;
  const auto after = Contents(1, &moved_all);
  EXPECT_EQ(moved_all, 5) << "the unnamed buffer must not move";
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, id_bytes] : before) {
    ASSERT_TRUE(after.contains(name)) << name;
    EXPECT_EQ(after.at(name).second, id_bytes.second) << name;
    absl::StatusOr<v1::BufferInfo> a = clients_[0]->GetBuffer(name);
    absl::StatusOr<v1::BufferInfo> b = clients_[1]->GetBuffer(name);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->dtype(), b->dtype()) << name;
    EXPECT_EQ(a->layout(), b->layout()) << name;
    EXPECT_EQ(a->shape_size(), b->shape_size()) << name;
    EXPECT_EQ(a->ttl_seconds(), b->ttl_seconds()) << name;
  }
  // The source is untouched.
  EXPECT_EQ(Contents(0), before);
}

TEST_F(TenantMoveTest, ImportRefusesExistingNamesUnlessReplaceAndChangesNothing) {
  Populate();
  ASSERT_EQ(RunOn(0, "tenant export " + ShellQuote(Path("export"))).exit_code, 0);
  // The destination already has one of the names, with other contents, and another buffer.
  ASSERT_EQ(RunOn(1, "create --shape 2 --fill 5 --name ints").exit_code, 0);
  ASSERT_EQ(RunOn(1, "create --shape 2 --fill 6 --name other").exit_code, 0);
  const auto destination = Contents(1);

  Result refused = RunOn(1, "tenant import " + ShellQuote(Path("export")));
  EXPECT_EQ(refused.exit_code, 10 + static_cast<int>(absl::StatusCode::kAlreadyExists))
      << refused.err;
  EXPECT_EQ(refused.err,
            "gpucompute: tenant import: ALREADY_EXISTS: the server already has buffers named "
            "ints; nothing was imported (--replace replaces them)\n");
  EXPECT_EQ(Contents(1), destination);

  Result replaced = RunOn(1, "tenant import --replace " + ShellQuote(Path("export")));
  ASSERT_EQ(replaced.exit_code, 0) << replaced.err;
  const auto after = Contents(1);
  EXPECT_EQ(after.size(), 6u);
  EXPECT_EQ(after.at("ints").second, Contents(0).at("ints").second);
  EXPECT_EQ(after.at("other"), destination.at("other"));

  // Exporting into a directory that holds an export is refused before anything is written.
  const std::string manifest = ReadFile(Path("export/MANIFEST"));
  Result again = RunOn(0, "tenant export " + ShellQuote(Path("export")));
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_EQ(again.err, "gpucompute: tenant export: " + Path("export") +
                           " already holds an export: choose another directory, or remove this "
                           "one first\n");
  EXPECT_EQ(ReadFile(Path("export/MANIFEST")), manifest);
}

// A buffer the destination refuses part way (its memory limit) undoes the import: the
// buffers created before it are deleted again.
TEST_F(TenantMoveTest, AnImportTheServerRefusesPartWayLeavesNothingBehind) {
  Populate();
  // 30 MiB, made last, so that the export lists it last.
  ASSERT_EQ(RunOn(0, "create --shape 3932160 --fill 2 --name large").exit_code, 0);
  ASSERT_EQ(RunOn(0, "tenant export " + ShellQuote(Path("export"))).exit_code, 0);
  std::vector<std::string> manifest =
      absl::StrSplit(ReadFile(Path("export/MANIFEST")), '\n', absl::SkipEmpty());
  ASSERT_EQ(manifest.back().substr(manifest.back().find(' ') + 1), "large");
  // 40 MiB already held on the 64 MiB destination.
  ASSERT_EQ(RunOn(1, "create --shape 5242880 --name ballast").exit_code, 0);
  absl::StatusOr<v1::BufferInfo> ballast = clients_[1]->GetBuffer("ballast");
  ASSERT_TRUE(ballast.ok()) << ballast.status();

  Result refused = RunOn(1, "tenant import " + ShellQuote(Path("export")));
  EXPECT_EQ(refused.exit_code, 10 + static_cast<int>(absl::StatusCode::kResourceExhausted))
      << refused.err;
  EXPECT_EQ(refused.err.rfind("gpucompute: tenant import large: RESOURCE_EXHAUSTED: ", 0), 0u)
      << refused.err;
  absl::StatusOr<v1::ListBuffersResponse> left = clients_[1]->ListBuffers();
  ASSERT_TRUE(left.ok()) << left.status();
  ASSERT_EQ(left->buffers_size(), 1) << left->DebugString();
  EXPECT_EQ(left->buffers(0).id(), ballast->id());
}

TEST_F(TenantMoveTest, ImportRefusesAnIncompleteOrDamagedExportAndCreatesNothing) {
  Populate();
  ASSERT_EQ(RunOn(0, "tenant export " + ShellQuote(Path("export"))).exit_code, 0);
  int all = 0;
  Contents(1, &all);
  ASSERT_EQ(all, 0);

  // A damaged payload byte in the last file: the files before it were uploaded already,
  // and are deleted again.
  std::vector<std::string> manifest =
      absl::StrSplit(ReadFile(Path("export/MANIFEST")), '\n', absl::SkipEmpty());
  const std::string last = Path("export/" + manifest.back().substr(0, manifest.back().find(' ')));
  const std::string good = ReadFile(last);
  std::string bad = good;
  bad[bad.size() - 5] ^= 1;
  std::ofstream(last, std::ios::binary | std::ios::trunc) << bad;
  Result damaged = RunOn(1, "tenant import " + ShellQuote(Path("export")));
  EXPECT_EQ(damaged.exit_code, 1) << damaged.err;
  EXPECT_NE(damaged.err.find(last + ": the payload's CRC32C does not match: the file is corrupt"),
            std::string::npos)
      << damaged.err;
  Contents(1, &all);
  EXPECT_EQ(all, 0);

  // A truncated file is refused before anything is sent.
  std::ofstream(last, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 1);
  Result truncated = RunOn(1, "tenant import " + ShellQuote(Path("export")));
  EXPECT_EQ(truncated.exit_code, 1) << truncated.err;
  EXPECT_NE(truncated.err.find("the export is incomplete or damaged"), std::string::npos)
      << truncated.err;
  Contents(1, &all);
  EXPECT_EQ(all, 0);

  // Without its manifest, a directory is no export.
  std::ofstream(last, std::ios::binary | std::ios::trunc) << good;
  std::filesystem::remove(Path("export/MANIFEST"));
  Result incomplete = RunOn(1, "tenant import " + ShellQuote(Path("export")));
  EXPECT_EQ(incomplete.exit_code, 1);
  EXPECT_EQ(incomplete.err, "gpucompute: tenant import: " + Path("export") +
                                " has no MANIFEST: it is no export, or an export that did not "
                                "finish (tenant export writes it last)\n");
  Contents(1, &all);
  EXPECT_EQ(all, 0);
}

}  // namespace
}  // namespace gpucompute
