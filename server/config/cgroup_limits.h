// The memory and CPU limits a container (or any control group) puts on this process, so
// that defaults chosen from the machine's size fit the container instead: in a container
// the kernel reports the host's memory and processors, and a server sized from them is
// killed by the OOM killer or throttled.
//
// Both cgroup versions are read: v2's memory.max and cpu.max, v1's memory.limit_in_bytes
// and cpu.cfs_quota_us / cpu.cfs_period_us. The limit in force is the tightest one on the
// path from the process's group up to the hierarchy's root. A container usually sees its
// own group mounted at the root (a cgroup namespace, or a v1 bind mount), while
// /proc/self/cgroup may still name the path on the host; a path that does not exist under
// the mount is read as the mount itself.
#ifndef GPUCOMPUTE_SERVER_CONFIG_CGROUP_LIMITS_H_
#define GPUCOMPUTE_SERVER_CONFIG_CGROUP_LIMITS_H_

#include <cstdint>
#include <optional>
#include <string>

namespace gpucompute {

struct CgroupLimits {
  // Bytes the group may use; unset when unlimited.
  std::optional<uint64_t> memory_bytes;
  // Processors' worth of CPU time per period (quota / period, e.g. 1.5); unset when
  // unlimited.
  std::optional<double> cpus;
};

// Reads the limits of the group the process belongs to, as listed in `self_cgroup`
// (/proc/self/cgroup), from the hierarchies mounted under `root` (/sys/fs/cgroup).
// Missing or unreadable files count as no limit.
CgroupLimits ReadCgroupLimits(const std::string& root = "/sys/fs/cgroup",
                              const std::string& self_cgroup = "/proc/self/cgroup");

// The smaller of the machine's memory and the group's limit.
uint64_t LimitedMemoryBytes(uint64_t machine_bytes, const CgroupLimits& limits);

// Worker threads that fit the group: its CPU quota rounded up (1.5 CPUs: 2 threads), at
// most `processors` (those the process may run on) and at least 1.
int LimitedThreadCount(int processors, const CgroupLimits& limits);

// The processors this process may run on (its affinity mask; a CPU set narrows it).
int AvailableProcessors();

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CONFIG_CGROUP_LIMITS_H_
