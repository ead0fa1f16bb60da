// gpucompute-bench's sessions section: operations per second through sessions,
// SubmitAsync and the backend alone, the latency of a session's submit-and-wait, and
// RunChain. benchmark.cc describes the columns.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/benchmark.h"
#include "client/cpp/client.h"
#include "client/cpp/session.h"
#include "client/cpp/transfer_timing.h"
#include "kernels/dtype.h"
#include "server/core/backend.h"
#include "server/expression/expression.h"
#include "server/server.h"
#include "server/util/status_macros.h"

namespace gpucompute::bench {
namespace {

constexpr uint64_t kSmallN = 1024;
constexpr int kAsyncWindow = 64;
constexpr int kChainSteps = 100;

// x (ones) and y, float32[kSmallN], on the client's default stream, for SmallAdd.
absl::Status PrepareSmall(Client& client) {
  for (const char* name : {"x", "y"}) {
    v1::CreateBufferRequest request;
    request.set_dtype(v1::DTYPE_FLOAT32);
    request.add_shape(kSmallN);
    request.set_name(name);
    request.mutable_fill()->set_float_value(1.0);
    RETURN_IF_ERROR(client.CreateBuffer(request).status());
  }
  ASSIGN_OR_RETURN(bool idle, client.SynchronizeStream(""));
  if (!idle) return absl::DeadlineExceededError("the stream did not go idle");
  return absl::OkStatus();
}

absl::Status DeleteSmall(Client& client) {
  RETURN_IF_ERROR(client.DeleteBuffer("x"));
  return client.DeleteBuffer("y");
}

// y = x + 1: the small operation of this section.
v1::SubmitRequest SmallAdd() {
  return Elementwise("x + 1", {{"x", BufferOperand("x")}}, ExistingOutput("y"));
}

// The ceiling of the sessions rows: what the backend alone does with the same operation,
// with no executor, RPC or client. Each of `streams` threads enqueues `each` x + 1
// operations on a stream of its own, each between two events and completed on its end
// event, as the executor does, with at most kSessionCeilingWindow in flight.
constexpr int kSessionCeilingWindow = 64;

absl::StatusOr<double> BackendOpsPerSecond(Backend& backend, int streams, int each) {
  ASSIGN_OR_RETURN(expr::Program program,
                   expr::Compile("x + 1", {{"x", expr::ArrayInput{DType::kFloat32}}}));
  RETURN_IF_ERROR(backend.PrepareElementwise(program, DType::kFloat32).status());
  std::latch ready(streams + 1);
  std::latch go(1);
  std::vector<absl::Status> statuses(streams);
  std::vector<std::thread> threads;
  for (int t = 0; t < streams; ++t) {
    threads.emplace_back([&, t] {
      statuses[t] = [&]() -> absl::Status {
        absl::StatusOr<std::unique_ptr<Stream>> stream = backend.CreateStream(0);
        absl::StatusOr<DeviceMemory> x = backend.Allocate(0, kSmallN * 4);
        absl::StatusOr<DeviceMemory> y = backend.Allocate(0, kSmallN * 4);
        ready.count_down();
        go.wait();
        RETURN_IF_ERROR(stream.status());
        RETURN_IF_ERROR(x.status());
        RETURN_IF_ERROR(y.status());
        const DeviceMemory* inputs[] = {&*x};
        absl::Mutex mu;
        int done = 0;
        absl::Status failed;
        for (int k = 0; k < each; ++k) {
          {
            absl::MutexLock lock(&mu);
            auto room = [&] { return done > k - kSessionCeilingWindow; };
            mu.Await(absl::Condition(&room));
          }
          ASSIGN_OR_RETURN(std::shared_ptr<Event> start, (*stream)->Record());
          RETURN_IF_ERROR(
              backend.Elementwise(**stream, program, inputs, *y, DType::kFloat32, kSmallN)
                  .status());
          ASSIGN_OR_RETURN(std::shared_ptr<Event> end, (*stream)->Record());
          RETURN_IF_ERROR((*stream)->OnEvent(end, [&, start, end](absl::Status s) {
            (void)backend.ElapsedSeconds(*start, *end);
            absl::MutexLock lock(&mu);
            if (!s.ok()) failed = s;
            ++done;
          }));
        }
        absl::MutexLock lock(&mu);
        auto all_done = [&] { return done == each; };
        mu.Await(absl::Condition(&all_done));
        return failed;
      }();
    });
  }
  ready.arrive_and_wait();
  const Clock::time_point start = Clock::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  const double wall = SecondsSince(start);
  for (const absl::Status& status : statuses) RETURN_IF_ERROR(status);
  return streams * each / wall;
}

// CPU seconds of this process's threads, for a breakdown of where a row's time went:
// per thread id, its name and utime + stime (/proc/self/task); and the whole process's.
struct ThreadCpu {
  std::map<int, std::pair<std::string, double>> threads;
  double process = 0;
};

double TicksToSeconds(const std::string& stat, int utime_field) {
  // Fields after the name, which is in parentheses and may hold blanks.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
  // utime and stime are fields 14 and 15 of stat(5); fields[0] is field 3.
  const size_t at = static_cast<size_t>(utime_field - 3);
  double utime = 0, stime = 0;
  if (fields.size() <= at + 1 || !absl::SimpleAtod(fields[at], &utime) ||
      !absl::SimpleAtod(fields[at + 1], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

ThreadCpu SampleThreadCpu() {
  ThreadCpu cpu;
  cpu.process = TicksToSeconds(ReadSmallFile("/proc/self/stat"), 14);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", error)) {
    int tid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &tid)) continue;
    const std::string dir = entry.path().string();
    cpu.threads[tid] = {ReadSmallFile(dir + "/comm"),
                        TicksToSeconds(ReadSmallFile(dir + "/stat"), 14)};
  }
  return cpu;
}

// "name xN: S s (F of a core each)" for each thread name alive at the end, busiest
// first, then the rest of the process (threads that ended meanwhile: a row's clients).
std::string ThreadCpuSummary(const ThreadCpu& before, const ThreadCpu& after, double wall) {
  std::map<std::string, std::pair<int, double>> by_name;
  double named = 0;
  for (const auto& [tid, thread] : after.threads) {
    auto it = before.threads.find(tid);
    const double used = thread.second - (it == before.threads.end() ? 0 : it->second.second);
    auto& [count, seconds] = by_name[thread.first];
    ++count;
    seconds += used;
    named += used;
  }
  std::vector<std::pair<std::string, std::pair<int, double>>> sorted(by_name.begin(),
                                                                     by_name.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::vector<std::string> parts;
  for (const auto& [name, usage] : sorted) {
    if (usage.second < 0.01 * wall) continue;
    parts.push_back(absl::StrFormat("%s x%d %.2f s (%.2f each)", name, usage.first, usage.second,
                                    usage.second / usage.first / wall));
  }
  parts.push_back(absl::StrFormat("threads that ended %.2f s",
                                  std::max(0.0, after.process - before.process - named)));
  return absl::StrCat(absl::StrFormat("wall %.2f s; CPU: ", wall), absl::StrJoin(parts, ", "));
}

// Operations per second through one session per client, `clients` clients on threads of
// their own sending `total` operations in all, from the first submission to the last
// answer.
absl::StatusOr<double> SessionOpsPerSecond(const Server& server, int clients, int total,
                                           std::string* thread_cpu) {
  std::vector<std::unique_ptr<Client>> connected;
  for (int i = 0; i < clients; ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                     Connect(server, absl::StrCat("bench-session-", i)));
    RETURN_IF_ERROR(PrepareSmall(*client));
    connected.push_back(std::move(client));
  }
  const int each = std::max(1, total / clients);
  std::vector<std::unique_ptr<Session>> sessions;
  for (const auto& client : connected) {
    ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Open(*client));
    sessions.push_back(std::move(session));
  }
  std::latch go(1);
  std::vector<absl::Status> statuses(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      go.wait();
      std::vector<OperationFuture> futures;
      futures.reserve(each);
      for (int k = 0; k < each; ++k) futures.push_back(sessions[i]->Submit(SmallAdd()).result);
      statuses[i] = sessions[i]->Close();
      for (const OperationFuture& f : futures) {
        if (statuses[i].ok()) statuses[i] = Succeeded(f.Get());
      }
    });
  }
  const ThreadCpu cpu_before = SampleThreadCpu();
  const Clock::time_point start = Clock::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  const double wall = SecondsSince(start);
  *thread_cpu = ThreadCpuSummary(cpu_before, SampleThreadCpu(), wall);
  for (const absl::Status& status : statuses) RETURN_IF_ERROR(status);
  for (const auto& client : connected) RETURN_IF_ERROR(DeleteSmall(*client));
  return clients * each / wall;
}

// Operations per second of one client's SubmitAsync with kAsyncWindow in flight.
absl::StatusOr<double> AsyncOpsPerSecond(const Server& server, int total) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, "bench-async"));
  RETURN_IF_ERROR(PrepareSmall(*client));
  std::deque<OperationFuture> window;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < total; ++i) {
    if (window.size() == kAsyncWindow) {
      RETURN_IF_ERROR(Succeeded(window.front().Get()));
      window.pop_front();
    }
    window.push_back(client->SubmitAsync(SmallAdd()));
  }
  for (const OperationFuture& f : window) RETURN_IF_ERROR(Succeeded(f.Get()));
  const double wall = SecondsSince(start);
  RETURN_IF_ERROR(DeleteSmall(*client));
  return total / wall;
}

// The wall time of one GetServerInfo, the no-op.
absl::StatusOr<double> TimeNoop(Client& client) {
  const Clock::time_point start = Clock::now();
  RETURN_IF_ERROR(client.GetServerInfo().status());
  return SecondsSince(start);
}

struct SmallLatencies {
  // Submit(wait) and the no-op timed just before each; a session's submit-and-wait and
  // the no-op timed just before each.
  std::vector<double> submit, submit_noop, session, session_noop, device;
};

// Submit(wait) taking turns with GetServerInfo, then a session's submit-and-wait taking
// turns with GetServerInfo: each against no-ops timed beside it, in a loop of its own. A
// session's streams are still busy for a while after its answer, which slows a no-op
// timed right after it, so the two are not mixed.
absl::StatusOr<SmallLatencies> MeasureSmallLatencies(const Options& options, Client& client) {
  v1::SubmitRequest waiting = SmallAdd();
  waiting.set_wait(true);
  SmallLatencies l;
  for (int i = 0; i < kLatencyWarmup + options.samples; ++i) {
    ASSIGN_OR_RETURN(const double before, TimeNoop(client));
    const Clock::time_point start = Clock::now();
    absl::StatusOr<v1::Operation> op = client.Submit(waiting);
    const double wall = SecondsSince(start);
    RETURN_IF_ERROR(Succeeded(op));
    if (i < kLatencyWarmup) continue;
    l.submit_noop.push_back(before);
    l.submit.push_back(wall);
    l.device.push_back(op->timing().device_seconds());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Open(client));
  for (int i = 0; i < kLatencyWarmup + options.samples; ++i) {
    ASSIGN_OR_RETURN(const double before, TimeNoop(client));
    const Clock::time_point start = Clock::now();
    const absl::StatusOr<v1::Operation> answered = session->Submit(SmallAdd()).result.Get();
    const double wall = SecondsSince(start);
    RETURN_IF_ERROR(Succeeded(answered));
    if (i < kLatencyWarmup) continue;
    l.session_noop.push_back(before);
    l.session.push_back(wall);
  }
  RETURN_IF_ERROR(session->Close());
  return l;
}

struct ChainTimes {
  double wall = 0;    // median
  double wall99 = 0;  // p99
  double device = 0;  // median of the sums of the steps' device times
  double noop = 0;    // median of the no-ops timed alternately with the runs
};

// A chain of kChainSteps: kChainSteps - 1 increments, each of the last one's output,
// then the max of the last, checked. Its tags carry `run` when not empty.
Chain SmallChain(bool separate_launches, const std::string& run) {
  Chain chain;
  chain.SeparateLaunches(separate_launches);
  auto tag = [&](int k) { return run.empty() ? std::string() : absl::StrCat(run, "-", k); };
  std::string last = chain.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}), tag(0));
  for (int k = 1; k < kChainSteps - 1; ++k) {
    last = chain.Add(Elementwise("s + 1", {{"s", BufferOperand(TagRef(last))}}), tag(k));
  }
  chain.Add(Reduce(v1::REDUCE_KIND_MAX, TagRef(last)), tag(kChainSteps - 1));
  return chain;
}

// The chain run options.samples times after warm-ups, each run timed alternately with
// the no-op: the same request each time (prepared from its second run, a warm-up), or
// with `fresh` one the server has not seen (planned at every run).
absl::StatusOr<ChainTimes> MeasureChain(const Options& options, Client& client,
                                        bool separate_launches, bool fresh) {
  const Chain same = SmallChain(separate_launches, "");
  std::vector<double> walls, devices, noops;
  for (int r = 0; r < kLatencyWarmup + options.samples; ++r) {
    const Chain chain = fresh ? SmallChain(separate_launches, absl::StrCat("r", r)) : same;
    ASSIGN_OR_RETURN(const double noop, TimeNoop(client));
    const Clock::time_point start = Clock::now();
    ASSIGN_OR_RETURN(v1::ChainResponse response, chain.Run(client));
    const double wall = SecondsSince(start);
    double device = 0;
    for (const v1::ChainStepResult& step : response.steps()) {
      RETURN_IF_ERROR(Succeeded(step.operation()));
      device += step.operation().timing().device_seconds();
    }
    const v1::Operation& max = response.steps(kChainSteps - 1).operation();
    if (max.values_size() != 1 || max.values(0).float_value() != kChainSteps) {
      return absl::InternalError("the chain's last step did not give its reference value");
    }
    if (r < kLatencyWarmup) continue;
    walls.push_back(wall);
    devices.push_back(device);
    noops.push_back(noop);
  }
  return ChainTimes{Median(walls), Percentile(walls, 99), Median(devices), Median(noops)};
}

}  // namespace

absl::StatusOr<SessionCeilings> MeasureSessionCeilings(const Options& options, Backend& backend) {
  SessionCeilings c;
  for (int streams : options.session_clients) {
    ASSIGN_OR_RETURN(double ops, BackendOpsPerSecond(backend, streams,
                                                     std::max(1, options.session_ops / streams)));
    c.push_back(ops);
  }
  return c;
}

namespace {

// The target of a sessions throughput row, where the project sets one.
std::optional<double> SessionTarget(int clients) {
  if (clients == 1) return 50000;
  if (clients == 16) return 150000;
  return std::nullopt;
}

}  // namespace

absl::Status RunSessions(const Options& options, const SessionCeilings& ceilings,
                         const Server& server) {
  const int total = options.session_ops;
  std::vector<double> throughput;
  std::vector<std::string> thread_cpu;
  for (int clients : options.session_clients) {
    ASSIGN_OR_RETURN(double ops, SessionOpsPerSecond(server, clients, total,
                                                     &thread_cpu.emplace_back()));
    throughput.push_back(ops);
  }
  ASSIGN_OR_RETURN(double async, AsyncOpsPerSecond(server, std::min(total, 5000)));

  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, "bench-session-latency"));
  RETURN_IF_ERROR(PrepareSmall(*client));
  ASSIGN_OR_RETURN(SmallLatencies l, MeasureSmallLatencies(options, *client));
  ASSIGN_OR_RETURN(ChainTimes chain, MeasureChain(options, *client, false, false));
  ASSIGN_OR_RETURN(ChainTimes separate, MeasureChain(options, *client, true, false));
  ASSIGN_OR_RETURN(ChainTimes planned, MeasureChain(options, *client, false, true));
  RETURN_IF_ERROR(DeleteSmall(*client));

  const double noop50 = Percentile(l.submit_noop, 50);
  const double submit_ratio = Percentile(l.submit, 50) / noop50;
  const double session_noop50 = Percentile(l.session_noop, 50);
  const double session_ratio = Percentile(l.session, 50) / session_noop50;
  // The round trip is the no-op timed beside Submit(wait): one timed right after a
  // chain's answer is slower (the server is still finishing the chain), which would
  // loosen the bound by as much.
  auto bound = [&](const ChainTimes& c) { return 2 * c.device + noop50; };
  Table table({"measure", "value", "p99 ms", "vs", "target", "met"}, 1);
  auto met = [](bool ok) { return std::string(ok ? "yes" : "NO"); };
  for (size_t i = 0; i < options.session_clients.size(); ++i) {
    const int clients = options.session_clients[i];
    table.AddRow({absl::StrCat("backend alone, ", clients, clients == 1 ? " stream" : " streams",
                               " (ops/s)"),
                  Fixed(ceilings[i], 0), "", "ceiling", "", ""});
  }
  for (size_t i = 0; i < options.session_clients.size(); ++i) {
    const int clients = options.session_clients[i];
    const std::optional<double> target = SessionTarget(clients);
    table.AddRow({absl::StrCat(clients == 1 ? "session, " : "sessions, ", clients,
                               clients == 1 ? " client" : " clients", " (ops/s)"),
                  Fixed(throughput[i], 0), "",
                  absl::StrCat(Fixed(throughput[i] / ceilings[i], 2), " of the backend alone"),
                  target ? absl::StrCat(">= ", Fixed(*target, 0)) : "",
                  target ? met(throughput[i] >= *target) : ""});
  }
  // Against one session, where a row has one client.
  std::string async_vs;
  for (size_t i = 0; i < options.session_clients.size(); ++i) {
    if (options.session_clients[i] == 1)
      async_vs = absl::StrCat(Fixed(throughput[i] / async, 1), "x slower than session");
  }
  table.AddRow({absl::StrCat("SubmitAsync, 1 client, ", kAsyncWindow, " in flight (ops/s)"),
                Fixed(async, 0), "", async_vs, "", ""});
  table.AddRow({"Submit(wait) p50 ms", Fixed(Percentile(l.submit, 50) * 1e3, 3),
                Fixed(Percentile(l.submit, 99) * 1e3, 3),
                absl::StrCat(Fixed(submit_ratio, 2), "x no-op"), "<= 1.2x",
                met(submit_ratio <= 1.2)});
  table.AddRow({"session submit+wait p50 ms", Fixed(Percentile(l.session, 50) * 1e3, 3),
                Fixed(Percentile(l.session, 99) * 1e3, 3),
                absl::StrCat(Fixed(session_ratio, 2), "x its no-op (",
                             Fixed(session_noop50 * 1e3, 3), " ms)"),
                "<= 1.2x", met(session_ratio <= 1.2)});
  table.AddRow({"GetServerInfo (no-op) p50 ms", Fixed(noop50 * 1e3, 3),
                Fixed(Percentile(l.submit_noop, 99) * 1e3, 3), "beside Submit(wait)", "", ""});
  table.AddRow(
      {"device time of one x + 1, median ms", Fixed(Median(l.device) * 1e3, 4), "", "", "", ""});
  auto chain_row = [&](std::string name, const ChainTimes& c, std::string vs) {
    table.AddRow({std::move(name), Fixed(c.wall * 1e3, 3), Fixed(c.wall99 * 1e3, 3),
                  absl::StrCat("device sum ", Fixed(c.device * 1e3, 3), " ms; no-op ",
                               Fixed(c.noop * 1e3, 3), " ms between runs", vs),
                  absl::StrCat("<= 2x device + no-op = ", Fixed(bound(c) * 1e3, 3)),
                  met(c.wall <= bound(c))});
  };
  chain_row(absl::StrCat("chain of ", kChainSteps, " steps, wall ms"), chain, "");
  chain_row("same chain, each step launched alone, ms", separate,
            absl::StrCat("; ", Fixed(separate.wall / chain.wall, 2), "x the chain above"));
  chain_row("same chain, planned at every run, ms", planned,
            absl::StrCat("; ", Fixed(planned.wall / chain.wall, 2), "x the chain above"));
  table.Print(absl::StrCat("sessions: x + 1 on ", kSmallN, " float32 values; ", total,
                           " operations per throughput row, ", options.samples,
                           " alternating samples per latency row; the server's --lane-spin: ",
                           options.lane_spin ? absl::FormatDuration(*options.lane_spin)
                                             : "its default"));
  // Where each throughput row's CPU went, by thread name: a thread class near one core
  // each is the row's bottleneck.
  for (size_t i = 0; i < options.session_clients.size(); ++i) {
    std::printf("%d client(s): %s\n", options.session_clients[i], thread_cpu[i].c_str());
  }
  return absl::OkStatus();
}

}  // namespace gpucompute::bench
