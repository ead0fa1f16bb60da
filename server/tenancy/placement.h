// Which replica of a scaled-out deployment serves each tenant, and the answer a replica
// gives a call for a tenant it does not serve.
//
// The placement table is the file HAProxy routes on (a map file): one "TENANT REPLICA"
// a line, '#' starts a comment. A tenant's buffers, streams and operations live on one
// replica only, so a replica that took a call for another replica's tenant would answer
// NOT_FOUND for its ids; it answers FAILED_PRECONDITION naming the owner instead, with the
// owner's address in trailing metadata (kRedirectAddressKey), and the clients reconnect
// there. The metadata keys are in gpucompute/v1/limits.h.
#ifndef GPUCOMPUTE_SERVER_TENANCY_PLACEMENT_H_
#define GPUCOMPUTE_SERVER_TENANCY_PLACEMENT_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute {

// A parsed placement table: tenant -> replica name.
class PlacementTable {
 public:
  // INVALID_ARGUMENT naming the line for a line that is not "TENANT REPLICA", a tenant
  // name the tokens file could not hold, or a tenant listed twice. An empty table (no
  // rows) is valid: every tenant is then refused as having no row.
  static absl::StatusOr<PlacementTable> Parse(absl::string_view text);
  static absl::StatusOr<PlacementTable> Load(const std::string& path);

  // The replica `tenant` is placed on, or null.
  const std::string* Find(absl::string_view tenant) const;
  size_t size() const { return rows_.size(); }

 private:
  absl::flat_hash_map<std::string, std::string> rows_;
};

// Where the other replicas listen: explicit entries, then a template.
struct ReplicaAddresses {
  // NAME -> HOST:PORT (--replica-addresses); wins over the template.
  absl::flat_hash_map<std::string, std::string> explicit_addresses;
  // HOST:PORT with "{replica}" standing for the name (--replica-address-template); empty:
  // none.
  std::string address_template;

  // "NAME=HOST:PORT,NAME=HOST:PORT" into explicit_addresses; INVALID_ARGUMENT naming the
  // entry that is not NAME=HOST:PORT or names a replica twice.
  absl::Status ParseList(absl::string_view list);
  // The address of `replica`, if known.
  std::optional<std::string> Find(absl::string_view replica) const;
};

// Where a refused call should go instead.
struct Redirect {
  std::string replica;
  std::optional<std::string> address;  // absent when this server knows none
};

// The placement of tenants as this replica sees it. Thread-safe; Reload swaps the table
// atomically.
class Placement {
 public:
  // `replica_name` is this replica's row value; `table_file` is read now. INVALID_ARGUMENT
  // for an empty name, a template without "{replica}", or a table that does not parse.
  static absl::StatusOr<std::unique_ptr<Placement>> Create(std::string replica_name,
                                                           std::string table_file,
                                                           ReplicaAddresses addresses);

  // Reads the table file again. On error the table in use stays, and the error says why.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);

  // OK when `tenant` is placed on this replica. Otherwise FAILED_PRECONDITION, and
  // `*redirect` says where its row places it (set only when it has a row).
  absl::Status Check(absl::string_view tenant, std::optional<Redirect>* redirect) const
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& replica_name() const { return replica_name_; }
  const std::string& table_file() const { return table_file_; }
  size_t row_count() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Placement(std::string replica_name, std::string table_file, ReplicaAddresses addresses)
      : replica_name_(std::move(replica_name)),
        table_file_(std::move(table_file)),
        addresses_(std::move(addresses)) {}

  const std::string replica_name_;
  const std::string table_file_;
  const ReplicaAddresses addresses_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const PlacementTable> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_TENANCY_PLACEMENT_H_
