// Who a call comes from: tenants, the scopes the registries key on, and the bearer
// tokens that name a tenant.
//
// A scope is the string BufferRegistry, Executor and RegionRegistry file things under:
// the client within its tenant. With authentication configured it is
// "TENANT" + kScopeSeparator + "CLIENT"; tenant names are [A-Za-z0-9._-] and client
// names printable ASCII, so the separator (a control byte) occurs in neither and the
// tenant is recoverable from the scope alone (TenantOfScope). Without authentication
// the scope is the client name itself and every scope is in the one unnamed tenant "".
#ifndef GPUCOMPUTE_SERVER_TENANCY_AUTH_H_
#define GPUCOMPUTE_SERVER_TENANCY_AUTH_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "gpucompute/v1/limits.h"

namespace grpc {
class ServerContextBase;
}

namespace gpucompute {

inline constexpr char kScopeSeparator = '\x1f';
// What an admin calls the one unnamed tenant "" (ListBuffersRequest.tenant): with
// authentication on, it holds the buffers persisted by a server without authentication
// that no --unauthenticated-tenant gave a tenant, and no token names it. Not a tenant name
// (ValidateTenantName refuses it), so no tenant of the tokens file can be taken for it.
inline constexpr absl::string_view kUnauthenticatedTenantName = "(unauthenticated)";

// Whether the credential a call was authenticated with still stands. A reload of the
// tokens file revokes a token it drops (or gives another tenant or admin right), and a
// call that acts long after it was admitted (a session, an upload stream) checks this
// before each request or message it acts on: one atomic load. Never revoked for a client
// certificate or without authentication.
class Credential {
 public:
  Credential() = default;  // never revoked
  explicit Credential(std::shared_ptr<const std::atomic<bool>> revoked)
      : revoked_(std::move(revoked)) {}
  bool revoked() const { return revoked_ != nullptr && revoked_->load(std::memory_order_acquire); }

 private:
  std::shared_ptr<const std::atomic<bool>> revoked_;
};

// The caller of one RPC, as IdentifyCaller (server/service/service_context.h) finds it.
struct Caller {
  std::string tenant;  // "" without authentication
  std::string client;  // metadata "gpucompute-client", "default" when absent
  bool admin = false;  // may see server-wide figures and manage the server
  std::string scope;   // ScopeOf(tenant, client)
  // The call's place among its tenant's calls in flight (TenantAdmission in
  // server/tenancy/admission.h), given back when the last holder lets go: whatever serves the
  // call past its handler (a reactor) keeps it.
  std::shared_ptr<const void> admission;
  // The token the call was authenticated with; never revoked without authentication.
  Credential credential;
};

// UNAUTHENTICATED: what a call whose token was revoked hears.
absl::Status TokenRevokedError();

// INVALID_ARGUMENT unless `tenant` is 1 to kMaxTenantNameBytes of [A-Za-z0-9._-].
absl::Status ValidateTenantName(absl::string_view tenant);
std::string ScopeOf(absl::string_view tenant, absl::string_view client);
// The tenant part of a scope: "" for a scope without one (no authentication).
absl::string_view TenantOfScope(absl::string_view scope);
inline bool SameTenant(absl::string_view scope_a, absl::string_view scope_b) {
  return TenantOfScope(scope_a) == TenantOfScope(scope_b);
}
// "tenant/client" for logs and metrics; the scope itself when it has no tenant.
std::string DisplayScope(absl::string_view scope);

// A tokens file: one "TOKEN TENANT [admin]" a line, '#' starts a comment. Tokens are
// kept only as SHA-256 digests, and Find compares the digest of the presented token
// with every entry in time that depends only on the table's size.
class TokenTable {
 public:
  struct Entry {
    std::array<uint8_t, 32> digest;
    std::string tenant;
    bool admin = false;
    // Set once a reload drops the entry or changes what it grants (Credential).
    std::shared_ptr<std::atomic<bool>> revoked = std::make_shared<std::atomic<bool>>(false);
  };

  // INVALID_ARGUMENT naming the line (never its token) for a malformed line or a token
  // listed twice, and for a file that lists no token at all (empty or only comments).
  static absl::StatusOr<TokenTable> Parse(absl::string_view text);
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The entry of `token`, or null.
  const Entry* Find(absl::string_view token) const;
  size_t size() const { return entries_.size(); }
  // Takes over from `old`, the table in use until now: an entry `old` has too, granting
  // the same, keeps its revocation flag, so that the calls it authenticated go on; every
  // other entry of `old` is revoked.
  void Succeed(const TokenTable& old);

 private:
  std::vector<Entry> entries_;
};

// The tenant and admin right of a verified credential.
struct Identity {
  std::string tenant;
  bool admin = false;
  Credential credential;
};

// Checks the credentials of calls: a bearer token from the tokens file and, with mutual
// TLS, the verified client certificate. Thread-safe; Reload swaps the table atomically.
class Authenticator {
 public:
  // `tokens_file` may be empty (no tokens); `client_certificates` says the TLS layer
  // verifies client certificates (mTLS), whose common name then names a tenant.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(std::string tokens_file,
                                                               bool client_certificates);

  // Reads the tokens file again. On error the table in use stays, and the error says
  // why (never quoting a token). A token the new file drops, or lists for another tenant
  // or admin right, is revoked: the calls it opened are refused from their next request.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);

  // `authorization` is the call's "authorization" metadata, if any; `certificate_cn`
  // the verified client certificate's common name, if any. A token, when one is sent,
  // decides; else the certificate's common name names the tenant (not an admin).
  // UNAUTHENTICATED, without echoing the token, when neither identifies the caller.
  absl::StatusOr<Identity> Authenticate(std::optional<absl::string_view> authorization,
                                        std::optional<absl::string_view> certificate_cn) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Authenticate with the credentials `context` carries: its "authorization" metadata
  // and the common name of the client certificate its TLS layer verified.
  absl::StatusOr<Identity> AuthenticateCall(const grpc::ServerContextBase& context) const
      ABSL_LOCKS_EXCLUDED(mu_);

  size_t token_count() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Authenticator(std::string tokens_file, bool client_certificates)
      : tokens_file_(std::move(tokens_file)), client_certificates_(client_certificates) {}

  const std::string tokens_file_;
  const bool client_certificates_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_TENANCY_AUTH_H_
