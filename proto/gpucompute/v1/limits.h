// The wire limits of gpucompute.v1 that the client and the server share. The server
// reports them in GetServerInfo's Limits; a client built with this header already
// agrees with the reference server.
#ifndef GPUCOMPUTE_V1_LIMITS_H_
#define GPUCOMPUTE_V1_LIMITS_H_

#include <cstdint>

namespace gpucompute {

// The metadata key that names the calling client, and the name of a client that sends
// none.
inline constexpr char kClientMetadataKey[] = "gpucompute-client";
inline constexpr char kDefaultClient[] = "default";
inline constexpr uint64_t kMaxClientNameBytes = 128;
// The metadata key of a call's request id: the client may set one (1 to
// kMaxRequestIdBytes printable ASCII characters), else the server makes one up; either
// way the server returns it in the call's initial metadata and logs it with the call.
inline constexpr char kRequestIdMetadataKey[] = "x-request-id";
inline constexpr uint64_t kMaxRequestIdBytes = 128;
// Replicas (a deployment scaled out by tenant). A client may name its tenant in
// kTenantMetadataKey, which a proxy routes on; the server refuses a name that is not the
// authenticated tenant's (PERMISSION_DENIED). A replica that does not serve the tenant
// answers FAILED_PRECONDITION with the owner in trailing metadata: its name, and its
// HOST:PORT when the replica knows it, where the client reconnects once.
inline constexpr char kTenantMetadataKey[] = "gpucompute-tenant";
inline constexpr uint64_t kMaxTenantNameBytes = 64;  // [A-Za-z0-9._-]
inline constexpr char kRedirectAddressKey[] = "gpucompute-redirect-address";
inline constexpr char kRedirectReplicaKey[] = "gpucompute-redirect-replica";

// gRPC messages are capped here, both ways.
inline constexpr uint64_t kMaxMessageBytes = uint64_t{64} << 20;
// Room for the framing around a chunk's bytes in an UploadRequest or DownloadResponse.
inline constexpr uint64_t kChunkOverheadBytes = uint64_t{64} << 10;
inline constexpr uint64_t kMaxChunkBytes = kMaxMessageBytes - kChunkOverheadBytes;
inline constexpr uint64_t kDefaultChunkBytes = uint64_t{4} << 20;
inline constexpr uint32_t kMaxExpressionBytes = 64 << 10;
inline constexpr uint32_t kMaxInlineValues = 4096;

// Sessions and chains: operations a session may have accepted and not yet answered
// (the server stops reading its requests meanwhile), and the steps of one chain.
inline constexpr uint32_t kMaxSessionInFlight = 1024;
inline constexpr uint32_t kMaxChainSteps = 4096;
inline constexpr char kTagPrefix[] = "tag:";
// Multi-range uploads (BufferService.BeginUpload): range streams one upload may have,
// and the seconds without data after which the server gives an upload up.
inline constexpr uint32_t kMaxUploadRanges = 1024;
inline constexpr double kDefaultUploadIdleTimeoutSeconds = 60;
// Longest lease a buffer may carry (CreateBufferRequest.ttl_seconds): 30 days. A longer
// life is no lease at all (ttl 0).
inline constexpr double kMaxTtlSeconds = 30 * 24 * 3600.0;

}  // namespace gpucompute

#endif  // GPUCOMPUTE_V1_LIMITS_H_
