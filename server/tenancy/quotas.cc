#include "server/tenancy/quotas.h"

#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/tenancy/auth.h"
#include "common/byte_size.h"
#include "server/config/config_file.h"
#include "server/server.h"

namespace gpucompute {
namespace {

// The keys a line sets, over `base`.
absl::StatusOr<TenantQuota> ParseKeys(const std::vector<absl::string_view>& fields, size_t first,
                                      TenantQuota base) {
  for (size_t i = first; i < fields.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(fields[i], '=');
    uint64_t* target = kv.first == "device_bytes" ? &base.device_bytes
                       : kv.first == "buffers"    ? &base.buffers
                       : kv.first == "streams"    ? &base.streams
                       : kv.first == "operations" ? &base.operations
                                                  : nullptr;
    if (target == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key '", kv.first, "' (device_bytes, buffers, streams, operations)"));
    }
    if (kv.first == "device_bytes") {
      absl::StatusOr<uint64_t> bytes = ParseByteSize(kv.second);
      if (!bytes.ok()) return bytes.status();
      *target = *bytes;
    } else if (!absl::SimpleAtoi(kv.second, target)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kv.first, " needs a non-negative integer, not '", kv.second, "'"));
    }
  }
  return base;
}

}  // namespace

absl::StatusOr<QuotaTable> QuotaTable::Parse(absl::string_view text) {
  QuotaTable table;
  // Tenant lines take the defaults, wherever the default line is: they are applied last.
  std::vector<std::pair<std::string, std::vector<absl::string_view>>> overrides;
  std::optional<int> default_line;
  for (const auto& [line_number, fields] : SplitConfigLines(text)) {
    auto bad = [line_number = line_number](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", why));
    };
    if (fields[0] == "default") {
      if (default_line.has_value()) {
        return bad(absl::StrCat("a second default line (the first is line ", *default_line, ")"));
      }
      default_line = line_number;
      absl::StatusOr<TenantQuota> quota = ParseKeys(fields, 1, TenantQuota{});
      if (!quota.ok()) return bad(quota.status().message());
      table.defaults_ = *quota;
    } else if (fields[0] == "tenant") {
      if (fields.size() < 2) return bad("expected 'tenant NAME KEY=VALUE...'");
      if (absl::Status s = ValidateTenantName(fields[1]); !s.ok()) return bad(s.message());
      if (absl::StatusOr<TenantQuota> quota = ParseKeys(fields, 2, TenantQuota{}); !quota.ok()) {
        return bad(quota.status().message());
      }
      for (const auto& [name, unused] : overrides) {
        if (name == fields[1]) return bad(absl::StrCat("tenant '", name, "' has a line already"));
      }
      overrides.emplace_back(std::string(fields[1]), fields);
    } else {
      return bad("expected 'default KEY=VALUE...' or 'tenant NAME KEY=VALUE...'");
    }
  }
  for (const auto& [name, fields] : overrides) {
    table.tenants_[name] = *ParseKeys(fields, 2, table.defaults_);  // checked above
  }
  return table;
}

absl::StatusOr<QuotaTable> QuotaTable::Load(const std::string& path) {
  return LoadConfigFile("quota file", path, &QuotaTable::Parse);
}

const TenantQuota& QuotaTable::For(absl::string_view tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? defaults_ : it->second;
}

TenantQuota Quotas::For(absl::string_view tenant) const {
  absl::ReaderMutexLock lock(&mu_);
  return table_.For(tenant);
}

void Quotas::Replace(QuotaTable table) {
  absl::MutexLock lock(&mu_);
  table_ = std::move(table);
}

absl::Status QuotaExceeded(absl::string_view tenant, absl::string_view key, uint64_t quota,
                           absl::string_view what) {
  return absl::ResourceExhaustedError(absl::StrCat("tenant '", tenant, "' is at its quota '", key,
                                                   "' of ", quota, " (", what,
                                                   "); free some first or ask for a larger quota"));
}

}  // namespace gpucompute
