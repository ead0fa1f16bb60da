// The process_* series every Prometheus client library exports (resident memory, CPU
// time, open files, start time), read from /proc/self. On a container's memory limit,
// process_resident_memory_bytes is what the OOM killer compares.
#ifndef GPUCOMPUTE_SERVER_METRICS_PROCESS_METRICS_H_
#define GPUCOMPUTE_SERVER_METRICS_PROCESS_METRICS_H_

#include <vector>

#include "server/metrics/exposition.h"

namespace gpucompute::metrics {

// The families that could be read; none where /proc is missing.
std::vector<Family> ProcessFamilies();

}  // namespace gpucompute::metrics

#endif  // GPUCOMPUTE_SERVER_METRICS_PROCESS_METRICS_H_
