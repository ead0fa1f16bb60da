// gRPC channel arguments from the environment, which the client and the server both
// apply to their connections after their own, e.g. to try transport settings.
#ifndef GPUCOMPUTE_COMMON_GRPC_TUNING_H_
#define GPUCOMPUTE_COMMON_GRPC_TUNING_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpucompute {

// The environment variable of integer gRPC channel arguments, as
// "NAME=VALUE[,NAME=VALUE...]", e.g.
// "grpc.http2.max_frame_size=16777215,grpc.experimental.tcp_read_chunk_size=1048576".
inline constexpr char kGrpcArgsEnvironmentVariable[] = "GPUCOMPUTE_GRPC_ARGS";

using GrpcIntArgs = std::vector<std::pair<std::string, int>>;

// Parses the variable's syntax; INVALID_ARGUMENT naming the bad entry.
absl::StatusOr<GrpcIntArgs> ParseGrpcArgs(absl::string_view text);

// The arguments the environment variable names (unset or empty: none); INVALID_ARGUMENT
// naming the variable when it does not parse.
absl::StatusOr<GrpcIntArgs> GrpcArgsFromEnvironment();

// Holds a reference to the gRPC library until the process exits, for a program's main.
// Without it, the last gRPC object to go (the server, or the client's channel) calls the
// last grpc_shutdown(), which joins gRPC's executor threads; one of them can sit in a poll
// for up to about 10 s (gRPC 1.51), and a program that is about to exit would wait for it
// after its own work is done: past a shutdown's stated bound, for the server.
void HoldGrpcUntilExit();

}  // namespace gpucompute

#endif  // GPUCOMPUTE_COMMON_GRPC_TUNING_H_
