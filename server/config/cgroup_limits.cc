#include "server/config/cgroup_limits.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace gpucompute {
namespace {

namespace fs = std::filesystem;

// v1 reports "no limit" as the largest page-aligned signed 64-bit value; anything this
// large is no limit in practice either.
constexpr uint64_t kUnlimitedBytes = uint64_t{1} << 62;

std::optional<std::string> ReadFirstLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

struct Membership {
  std::string v2_path;                                  // "0::PATH"
  std::vector<std::pair<std::string, std::string>> v1;  // (controller list, path)
};

Membership ReadMembership(const std::string& self_cgroup) {
  Membership m;
  std::ifstream in(self_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    // hierarchy-id:controllers:path; the path may itself contain ':'.
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) {
      m.v2_path = parts[2];
    } else {
      m.v1.emplace_back(parts[1], parts[2]);
    }
  }
  return m;
}

// Calls visit(dir) for the process's group under the hierarchy mounted at `base`, then
// for each ancestor up to `base` itself.
void ForEachAncestor(const fs::path& base, const std::string& group_path,
                     const std::function<void(const fs::path&)>& visit) {
  fs::path dir = base;
  const std::string relative(absl::StripPrefix(group_path, "/"));
  std::error_code ec;
  if (!relative.empty() && fs::is_directory(base / relative, ec)) dir = base / relative;
  const fs::path stop = base.lexically_normal();
  for (fs::path d = dir.lexically_normal();; d = d.parent_path()) {
    visit(d);
    if (d == stop || d == d.parent_path() || d.native().size() <= stop.native().size()) break;
  }
}

class Tightest {
 public:
  void Memory(uint64_t bytes) {
    if (bytes < kUnlimitedBytes)
      limits_.memory_bytes = std::min(bytes, limits_.memory_bytes.value_or(bytes));
  }
  void Cpus(double quota, double period) {
    if (quota > 0 && period > 0) {
      const double cpus = quota / period;
      limits_.cpus = std::min(cpus, limits_.cpus.value_or(cpus));
    }
  }
  const CgroupLimits& limits() const { return limits_; }

 private:
  CgroupLimits limits_;
};

void ReadV2(const fs::path& base, const std::string& path, Tightest& out) {
  std::error_code ec;
  if (!fs::exists(base / "cgroup.controllers", ec)) return;
  ForEachAncestor(base, path, [&](const fs::path& dir) {
    uint64_t bytes = 0;
    if (auto line = ReadFirstLine(dir / "memory.max"); line && absl::SimpleAtoi(*line, &bytes))
      out.Memory(bytes);
    if (auto line = ReadFirstLine(dir / "cpu.max")) {
      // "QUOTA PERIOD", QUOTA "max" when unlimited.
      std::vector<absl::string_view> fields = absl::StrSplit(*line, ' ', absl::SkipEmpty());
      double quota = 0, period = 0;
      if (fields.size() == 2 && absl::SimpleAtod(fields[0], &quota) &&
          absl::SimpleAtod(fields[1], &period)) {
        out.Cpus(quota, period);
      }
    }
  });
}

bool HasController(absl::string_view list, absl::string_view controller) {
  for (absl::string_view c : absl::StrSplit(list, ',')) {
    if (c == controller) return true;
  }
  return false;
}

void ReadV1(const fs::path& root, const Membership& m, Tightest& out) {
  std::error_code ec;
  for (const auto& [controllers, path] : m.v1) {
    if (HasController(controllers, "memory") &&
        fs::exists(root / "memory" / "memory.limit_in_bytes", ec)) {
      ForEachAncestor(root / "memory", path, [&](const fs::path& dir) {
        uint64_t bytes = 0;
        if (auto line = ReadFirstLine(dir / "memory.limit_in_bytes");
            line && absl::SimpleAtoi(*line, &bytes)) {
          out.Memory(bytes);
        }
      });
    }
    if (HasController(controllers, "cpu")) {
      // Mounted as cpu/ or as cpu,cpuacct/ (often both, one a link to the other).
      for (const char* name : {"cpu", "cpu,cpuacct", "cpuacct,cpu"}) {
        if (!fs::exists(root / name / "cpu.cfs_quota_us", ec)) continue;
        ForEachAncestor(root / name, path, [&](const fs::path& dir) {
          double quota = 0, period = 0;
          auto q = ReadFirstLine(dir / "cpu.cfs_quota_us");
          auto p = ReadFirstLine(dir / "cpu.cfs_period_us");
          if (q && p && absl::SimpleAtod(*q, &quota) && absl::SimpleAtod(*p, &period))
            out.Cpus(quota, period);
        });
        break;
      }
    }
  }
}

}  // namespace

CgroupLimits ReadCgroupLimits(const std::string& root, const std::string& self_cgroup) {
  const Membership m = ReadMembership(self_cgroup);
  Tightest tightest;
  // v2 is mounted at the root (unified) or, on hybrid systems, at root/unified.
  ReadV2(root, m.v2_path, tightest);
  ReadV2(fs::path(root) / "unified", m.v2_path, tightest);
  ReadV1(root, m, tightest);
  return tightest.limits();
}

uint64_t LimitedMemoryBytes(uint64_t machine_bytes, const CgroupLimits& limits) {
  if (!limits.memory_bytes.has_value()) return machine_bytes;
  return machine_bytes == 0 ? *limits.memory_bytes : std::min(machine_bytes, *limits.memory_bytes);
}

int LimitedThreadCount(int processors, const CgroupLimits& limits) {
  int threads = std::max(1, processors);
  if (limits.cpus.has_value()) {
    threads = std::min(threads, static_cast<int>(std::min(std::ceil(*limits.cpus), 1e6)));
  }
  return std::max(1, threads);
}

int AvailableProcessors() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace gpucompute
