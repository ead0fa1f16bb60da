// gpucompute-server: serves gpucompute.v1 over gRPC.
#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_tuning.h"
#include "common/transfer_memory.h"
#include "server/config/flags.h"
#include "server/util/log.h"
#include "server/server.h"

namespace {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and returns them. Called first thing in
// main, before any thread exists: every thread started later (gRPC's, the backend's, the
// CUDA runtime's) inherits the mask, so none of them can take the signals' default action,
// and a signal that comes before the watcher below runs stays pending until it does.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Takes the blocked signals with sigwait on a thread of its own, so that nothing runs in a
// signal handler: SIGINT and SIGTERM shut the server down once it serves, SIGHUP re-reads
// its tokens and quota files (one that comes while the server starts is dropped: Start
// reads the files anyway). A signal that comes while
// the server starts is remembered: main sees it when Server::Start returns and stops at
// once. Start is not interrupted (nor the process ended under it): on CUDA it sets up the
// devices and warms cuBLAS, seconds at most, and letting it finish means one way out, in
// which the backend releases the devices in order and the process exits 0.
class StopSignalWatcher {
 public:
  explicit StopSignalWatcher(const sigset_t& signals)
      : signals_(signals), thread_([this] { Run(); }) {}
  ~StopSignalWatcher() { Stop(); }

  // From now on a signal shuts `server` down; false, leaving it alone, when one has
  // already come.
  bool Serve(gpucompute::Server* server) {
    absl::MutexLock lock(&mu_);
    if (signalled_) return false;
    server_ = server;
    return true;
  }

  // Ends the watching thread; signals that come later are left pending. Called before the
  // server is destroyed.
  void Stop() {
    if (!thread_.joinable()) return;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      server_ = nullptr;
    }
    // Blocked everywhere, the signal stays pending on the thread until its sigwait.
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }

 private:
  void Run() {
    for (;;) {
      int signal = 0;
      if (sigwait(&signals_, &signal) != 0) continue;
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (signal == SIGHUP) {
        // Under mu_ as below. A bad file is logged by Reload and changes nothing.
        if (server_ != nullptr) (void)server_->Reload();
        continue;
      }
      if (signalled_) continue;  // the first one is already stopping the server
      signalled_ = true;
      gpucompute::Log(gpucompute::LogLevel::kInfo,
                      signal == SIGINT ? "SIGINT, stopping" : "SIGTERM, stopping");
      // Under mu_, so that main cannot destroy the server meanwhile (it calls Stop first).
      if (server_ != nullptr) server_->Shutdown();
    }
  }

  const sigset_t signals_;
  absl::Mutex mu_;
  gpucompute::Server* server_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool signalled_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it runs on the members above
};

}  // namespace

int main(int argc, char** argv) {
  gpucompute::RetainTransferMemory();
  // Abseil's lock-order checking, on where Abseil was built without NDEBUG (as Debian's
  // is), takes a process-wide spin lock and a graph lookup on every absl::Mutex
  // acquisition: it serializes the server's threads. The tests keep it on, and so still
  // catch a lock-order cycle.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const sigset_t stop_signals = BlockStopSignals();
  // After the signals are blocked: gRPC starts threads, and they inherit the mask.
  gpucompute::HoldGrpcUntilExit();
  const gpucompute::ParsedCommandLine command_line =
      gpucompute::ParseServerCommandLine(std::vector<std::string>(argv + 1, argv + argc));
  switch (command_line.outcome) {
    case gpucompute::ParsedCommandLine::Outcome::kHelp:
      std::fputs(command_line.usage.c_str(), stdout);
      return 0;
    case gpucompute::ParsedCommandLine::Outcome::kError:
      std::fprintf(stderr, "gpucompute-server: %s\n\n%s", command_line.error.c_str(),
                   command_line.usage.c_str());
      return 2;
    case gpucompute::ParsedCommandLine::Outcome::kRun:
      break;
  }
  const gpucompute::ServerOptions& options = command_line.options;
  gpucompute::SetLogFormat(options.log_format);

  StopSignalWatcher watcher(stop_signals);
  absl::StatusOr<std::unique_ptr<gpucompute::Server>> server = gpucompute::Server::Start(options);
  if (!server.ok()) {
    gpucompute::Log(gpucompute::LogLevel::kError, server.status().message());
    return 1;
  }
  if (!watcher.Serve(server->get())) return 0;  // stopped while it started
  gpucompute::Log(
      gpucompute::LogLevel::kInfo,
      absl::StrCat((*server)->backend_name(), " backend, listening on port ", (*server)->port()));
  if ((*server)->metrics_port() != 0) {
    gpucompute::Log(gpucompute::LogLevel::kInfo,
                    absl::StrCat("metrics on port ", (*server)->metrics_port(), ", path /metrics"));
  }
  (*server)->Wait();
  watcher.Stop();
  return 0;
}
