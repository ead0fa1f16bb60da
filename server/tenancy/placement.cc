#include "server/tenancy/placement.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "server/config/config_file.h"
#include "server/tenancy/auth.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

constexpr absl::string_view kReplicaPlaceholder = "{replica}";

// HOST:PORT without white space; the host may be a bracketed IPv6 address. Checked only
// for shape: a wrong address is the operator's to see in the clients' errors.
bool LooksLikeHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == address.size()) return false;
  for (char c : address) {
    if (absl::ascii_isspace(c) || absl::ascii_iscntrl(c)) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<PlacementTable> PlacementTable::Parse(absl::string_view text) {
  PlacementTable table;
  for (const auto& [line_number, fields] : SplitConfigLines(text)) {
    auto bad = [&, line_number = line_number](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", why));
    };
    if (fields.size() != 2) return bad("expected 'TENANT REPLICA'");
    if (absl::Status s = ValidateTenantName(fields[0]); !s.ok()) return bad(s.message());
    if (!table.rows_.emplace(fields[0], fields[1]).second) {
      return bad(absl::StrCat("tenant '", fields[0], "' has a row on an earlier line too"));
    }
  }
  return table;
}

absl::StatusOr<PlacementTable> PlacementTable::Load(const std::string& path) {
  return LoadConfigFile("placement file", path, &PlacementTable::Parse);
}

const std::string* PlacementTable::Find(absl::string_view tenant) const {
  auto it = rows_.find(tenant);
  return it == rows_.end() ? nullptr : &it->second;
}

absl::Status ReplicaAddresses::ParseList(absl::string_view list) {
  for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(entry, '=');
    if (parts.first.empty() || !LooksLikeHostPort(parts.second)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replica-addresses entry '", entry, "' is not NAME=HOST:PORT"));
    }
    if (!explicit_addresses.emplace(parts.first, parts.second).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replica-addresses names replica '", parts.first, "' twice"));
    }
  }
  return absl::OkStatus();
}

std::optional<std::string> ReplicaAddresses::Find(absl::string_view replica) const {
  if (auto it = explicit_addresses.find(replica); it != explicit_addresses.end()) {
    return it->second;
  }
  if (address_template.empty()) return std::nullopt;
  return absl::StrReplaceAll(address_template, {{kReplicaPlaceholder, replica}});
}

absl::StatusOr<std::unique_ptr<Placement>> Placement::Create(std::string replica_name,
                                                             std::string table_file,
                                                             ReplicaAddresses addresses) {
  if (replica_name.empty() || table_file.empty()) {
    return absl::InvalidArgumentError(
        "--replica-name and --placement-file go together: a replica serves the tenants its "
        "rows of the placement table name; set both or neither");
  }
  if (!addresses.address_template.empty() &&
      (!absl::StrContains(addresses.address_template, kReplicaPlaceholder) ||
       !LooksLikeHostPort(addresses.address_template))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replica-address-template '", addresses.address_template,
        "' must be HOST:PORT with {replica} standing for the replica's name, e.g. "
        "{replica}.gpucompute-replicas:50051"));
  }
  std::unique_ptr<Placement> placement(
      new Placement(std::move(replica_name), std::move(table_file), std::move(addresses)));
  RETURN_IF_ERROR(placement->Reload());
  return placement;
}

absl::Status Placement::Reload() {
  ASSIGN_OR_RETURN(PlacementTable table, PlacementTable::Load(table_file_));
  absl::MutexLock lock(&mu_);
  table_ = std::make_shared<const PlacementTable>(std::move(table));
  return absl::OkStatus();
}

size_t Placement::row_count() const {
  absl::MutexLock lock(&mu_);
  return table_->size();
}

absl::Status Placement::Check(absl::string_view tenant, std::optional<Redirect>* redirect) const {
  redirect->reset();
  std::shared_ptr<const PlacementTable> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  const std::string* owner = table->Find(tenant);
  if (owner == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the placement table has no row for tenant ", tenant,
        ", so no replica serves it; an operator adds a row 'TENANT REPLICA' for it and reloads "
        "the servers and the proxy"));
  }
  if (*owner == replica_name_) return absl::OkStatus();
  Redirect& to = redirect->emplace(Redirect{*owner, addresses_.Find(*owner)});
  if (to.address.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tenant ", tenant, " is placed on replica ", to.replica, " at ",
                     *to.address, ", not on this replica (", replica_name_,
                     "); call it there, or through the proxy that routes on the table"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "tenant ", tenant, " is placed on replica ", to.replica, ", not on this replica (",
      replica_name_, "), and this server knows no address for it (--replica-addresses, "
      "--replica-address-template); call it through the proxy that routes on the table"));
}

}  // namespace gpucompute
