// Names the calling thread, so that a profiler (perf's "comm", top -H, gdb) tells the
// server's threads apart. Linux keeps 15 characters; longer names are cut.
#ifndef GPUCOMPUTE_SERVER_UTIL_THREAD_NAME_H_
#define GPUCOMPUTE_SERVER_UTIL_THREAD_NAME_H_

#include <pthread.h>

#include <algorithm>
#include <string>

namespace gpucompute {

inline void NameThisThread(const char* name) {
  std::string cut(name);
  cut.resize(std::min<size_t>(cut.size(), 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_UTIL_THREAD_NAME_H_
