#include "server/tenancy/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/config/config_file.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

std::array<uint8_t, 32> Digest(absl::string_view token) {
  std::array<uint8_t, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest.data());
  return digest;
}

absl::Status Unauthenticated(absl::string_view why) {
  return absl::UnauthenticatedError(
      absl::StrCat(why,
                   "; send metadata 'authorization: Bearer TOKEN' with a token the "
                   "server's tokens file lists"));
}

}  // namespace

absl::Status TokenRevokedError() {
  return absl::UnauthenticatedError(
      "the token this call was opened with was revoked (a reload of the server's tokens file "
      "dropped it); open a new call with a token the file lists");
}

absl::Status ValidateTenantName(absl::string_view tenant) {
  const bool ok = !tenant.empty() && tenant.size() <= kMaxTenantNameBytes &&
                  std::all_of(tenant.begin(), tenant.end(), [](char c) {
                    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("a tenant name must be 1 to ", kMaxTenantNameBytes,
                                                 " characters of A-Z a-z 0-9 . _ -"));
}

std::string ScopeOf(absl::string_view tenant, absl::string_view client) {
  if (tenant.empty()) return std::string(client);
  return absl::StrCat(tenant, absl::string_view(&kScopeSeparator, 1), client);
}

absl::string_view TenantOfScope(absl::string_view scope) {
  const size_t split = scope.find(kScopeSeparator);
  return split == absl::string_view::npos ? absl::string_view() : scope.substr(0, split);
}

std::string DisplayScope(absl::string_view scope) {
  std::string out(scope);
  for (char& c : out) {
    if (c == kScopeSeparator) c = '/';
  }
  return out;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text) {
  TokenTable table;
  for (const auto& [line_number, fields] : SplitConfigLines(text)) {
    // Errors name the line, never the token on it.
    auto bad = [&, line_number = line_number](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", why));
    };
    if (fields.size() < 2 || fields.size() > 3) {
      return bad("expected 'TOKEN TENANT [admin]'");
    }
    if (absl::Status s = ValidateTenantName(fields[1]); !s.ok()) return bad(s.message());
    if (fields.size() == 3 && fields[2] != "admin") {
      return bad(absl::StrCat("the third field may only be 'admin', not '", fields[2], "'"));
    }
    Entry entry{Digest(fields[0]), std::string(fields[1]), fields.size() == 3};
    for (const Entry& other : table.entries_) {
      if (other.digest == entry.digest) return bad("this token is listed on an earlier line too");
    }
    table.entries_.push_back(std::move(entry));
  }
  if (table.entries_.empty()) {
    // Malformed rather than "no tokens": with authentication on, it would refuse every
    // caller, and on a reload it would lock out every tenant that was working.
    return absl::InvalidArgumentError(
        "the tokens file lists no tokens (it is empty or only comments), so every caller "
        "would be refused; add a line 'TOKEN TENANT [admin]'");
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  return LoadConfigFile("tokens file", path, &TokenTable::Parse);
}

const TokenTable::Entry* TokenTable::Find(absl::string_view token) const {
  const std::array<uint8_t, 32> digest = Digest(token);
  // Every entry is compared, in constant time each, so the time taken says nothing
  // about which entry (or how much of one) matched.
  const Entry* found = nullptr;
  for (const Entry& entry : entries_) {
    const bool equal = CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0;
    if (equal) found = &entry;
  }
  return found;
}

void TokenTable::Succeed(const TokenTable& old) {
  // A reload is rare and a tokens file short: pairs compared plainly.
  for (const Entry& before : old.entries_) {
    auto kept = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
      return e.digest == before.digest && e.tenant == before.tenant && e.admin == before.admin;
    });
    if (kept != entries_.end()) {
      kept->revoked = before.revoked;
    } else {
      before.revoked->store(true, std::memory_order_release);
    }
  }
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(std::string tokens_file,
                                                                     bool client_certificates) {
  std::unique_ptr<Authenticator> auth(
      new Authenticator(std::move(tokens_file), client_certificates));
  if (!auth->tokens_file_.empty()) RETURN_IF_ERROR(auth->Reload());
  return auth;
}

absl::Status Authenticator::Reload() {
  if (tokens_file_.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(TokenTable table, TokenTable::Load(tokens_file_));
  absl::MutexLock lock(&mu_);
  // Under the lock, so that two reloads at once hand the flags on in order.
  if (table_ != nullptr) table.Succeed(*table_);
  table_ = std::make_shared<const TokenTable>(std::move(table));
  return absl::OkStatus();
}

size_t Authenticator::token_count() const {
  absl::MutexLock lock(&mu_);
  return table_ == nullptr ? 0 : table_->size();
}

namespace {

std::optional<absl::string_view> MetadataValue(const grpc::ServerContextBase& context,
                                               absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

// The common name of the client certificate the TLS layer verified, if any.
std::optional<std::string> CertificateCommonName(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return std::nullopt;
  std::vector<grpc::string_ref> names = auth->FindPropertyValues("x509_common_name");
  if (names.empty()) return std::nullopt;
  return std::string(names.front().data(), names.front().size());
}

}  // namespace

absl::StatusOr<Identity> Authenticator::AuthenticateCall(
    const grpc::ServerContextBase& context) const {
  const std::optional<std::string> cn = CertificateCommonName(context);
  return Authenticate(MetadataValue(context, "authorization"),
                      cn.has_value() ? std::optional<absl::string_view>(*cn) : std::nullopt);
}

absl::StatusOr<Identity> Authenticator::Authenticate(
    std::optional<absl::string_view> authorization,
    std::optional<absl::string_view> certificate_cn) const {
  if (authorization.has_value()) {
    absl::string_view token = *authorization;
    if (!absl::ConsumePrefix(&token, "Bearer ") && !absl::ConsumePrefix(&token, "bearer ")) {
      return Unauthenticated("the 'authorization' metadata is not of the form 'Bearer TOKEN'");
    }
    token = absl::StripAsciiWhitespace(token);
    std::shared_ptr<const TokenTable> table;
    {
      absl::MutexLock lock(&mu_);
      table = table_;
    }
    const TokenTable::Entry* entry = table == nullptr ? nullptr : table->Find(token);
    if (entry == nullptr) return Unauthenticated("the bearer token is not valid");
    return Identity{entry->tenant, entry->admin, Credential(entry->revoked)};
  }
  if (client_certificates_ && certificate_cn.has_value()) {
    if (absl::Status s = ValidateTenantName(*certificate_cn); !s.ok()) {
      return absl::UnauthenticatedError(
          absl::StrCat("the client certificate's common name cannot name a tenant: ", s.message()));
    }
    return Identity{std::string(*certificate_cn), false, Credential()};
  }
  return Unauthenticated("this server requires authentication and the call carries none");
}

}  // namespace gpucompute
