#include "server/metrics/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace gpucompute::metrics {
namespace {

Family Gauge(std::string name, std::string help, double value,
             MetricType type = MetricType::kGauge) {
  return Family{std::move(name), std::move(help), type, {Sample{{}, value}}, {}};
}

// Seconds since the epoch at which the machine booted (/proc/stat's btime).
double BootTime() {
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    double btime = 0;
    if (line.rfind("btime ", 0) == 0 && absl::SimpleAtod(line.substr(6), &btime)) return btime;
  }
  return 0;
}

}  // namespace

std::vector<Family> ProcessFamilies() {
  std::vector<Family> out;
  std::ifstream in("/proc/self/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The fields after the command name, which is in parentheses and may hold spaces;
  // fields[0] is field 3 of proc(5), "state".
  const size_t close = stat.rfind(')');
  if (close != std::string::npos) {
    std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    double utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
    if (fields.size() > 21 && absl::SimpleAtod(fields[11], &utime) &&
        absl::SimpleAtod(fields[12], &stime) && absl::SimpleAtod(fields[19], &start) &&
        absl::SimpleAtod(fields[20], &vsize) && absl::SimpleAtod(fields[21], &rss) && ticks > 0) {
      out.push_back(Gauge("process_cpu_seconds_total",
                          "User and system CPU time the process has used.", (utime + stime) / ticks,
                          MetricType::kCounter));
      out.push_back(
          Gauge("process_resident_memory_bytes", "Resident memory of the process.", rss * page));
      out.push_back(Gauge("process_virtual_memory_bytes", "Virtual memory of the process.", vsize));
      out.push_back(Gauge("process_start_time_seconds",
                          "When the process started, in seconds since the epoch.",
                          BootTime() + start / ticks));
    }
  }
  std::error_code ec;
  std::filesystem::directory_iterator fds("/proc/self/fd", ec);
  if (!ec) {
    // The iterator's own descriptor is among those counted.
    const double open =
        static_cast<double>(std::distance(fds, std::filesystem::directory_iterator())) - 1;
    out.push_back(Gauge("process_open_fds", "Open file descriptors.", open));
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out.push_back(Gauge("process_max_fds", "The most file descriptors the process may open.",
                        static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

}  // namespace gpucompute::metrics
