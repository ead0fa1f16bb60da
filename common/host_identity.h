// Who the host is, as the server reports it in ServerInfo (hostname, boot_id) and a client
// compares with its own: shared memory works only between processes of one host, and the
// boot id tells two machines (or two boots) with the same name apart.
#ifndef GPUCOMPUTE_COMMON_HOST_IDENTITY_H_
#define GPUCOMPUTE_COMMON_HOST_IDENTITY_H_

#include <unistd.h>

#include <climits>
#include <fstream>
#include <string>

namespace gpucompute {

// The host's name (gethostname), or "" if it cannot be read.
inline std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// The kernel's random id of this boot (/proc/sys/kernel/random/boot_id), or "" off Linux.
inline std::string BootId() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(file, id);
  return id;
}

}  // namespace gpucompute

#endif  // GPUCOMPUTE_COMMON_HOST_IDENTITY_H_
