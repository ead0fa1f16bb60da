#!/usr/bin/python3
"""The placement table of a sharded gpucompute: which replica holds each tenant.

The table is a text file of rows `TENANT REPLICA`; `#` starts a comment line and blank
lines are ignored. The servers read it (--placement-file) and HAProxy reads it as a map
file, so a row must read the same to both: exactly two fields, and no `#` after the
start of a line (HAProxy would take it as part of the replica's name).

  placement.py generate --tokens FILE --replicas gpucompute-0,gpucompute-1 --table FILE
      Keeps every row the table has and gives each tenant of the tokens file without one
      the replica with the fewest tenants (ties: the lowest ordinal). A tenant is never
      moved: its buffers are on the replica its row names.
  placement.py check --tokens FILE --replicas ... --table FILE [--sni-suffix SUFFIX]
      Exit status 1, with a message a line, when a tenant has no row, a row names a
      replica not in --replicas, a tenant has two rows or a row is malformed; with
      --sni-suffix, also when a tenant's name is not a DNS label (it could not be
      reached as TENANT.SUFFIX on the SNI route). A row for a tenant the tokens file
      does not list is a warning only (a tenant leaving, or one that authenticates
      with a client certificate).
  placement.py move TENANT REPLICA --table FILE [--replicas ...]
      Rewrites that tenant's row. Move its buffers first (docs/operations.md).
  placement.py haproxy --replicas NAME=HOST:PORT,... --map PATH --listen ADDR:PORT
                       [--tls-cert PEM --tls-ca PEM] [--health-listen ADDR:PORT]
                       [--sni-listen ADDR:PORT --sni-suffix SUFFIX] [--threads N [--busy-poll]]
      Writes a complete HAProxy configuration to stdout: one backend per replica with
      exactly one server, calls routed on the gpucompute-tenant header through the map.
      With --sni-listen, a second route beside it: TLS connections passed through
      untouched to the replica that the server name TENANT.SUFFIX of their ClientHello
      names, through the same map (the replicas then serve TLS, so --tls-ca is needed).
      --threads N runs N threads (nbthread; 1 to 64); --busy-poll makes them spin on
      their CPUs instead of sleeping (busy-polling), which is only sensible on cores of
      their own: give the proxy N exclusive CPUs. Which cores is left to the process's
      CPU set (in Kubernetes, the static CPU manager's), so there is no cpu-map.

The tokens file is read as the server reads it (server/tenancy/auth.cc): what the server
refuses, this refuses, with the same line number. Debian's python3, nothing else.
"""
import argparse
import os
import re
import sys
import tempfile

TENANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Replica names become HAProxy backend names and map values: a pod name fits.
REPLICA_NAME = re.compile(r"[A-Za-z0-9._-]{1,253}")
TENANT_HEADER = "gpucompute-tenant"
# A tenant reached on the SNI route as TENANT.SUFFIX: its name must be one DNS label as
# HAProxy sees it, lowercased (a server name is case-insensitive).
DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
DNS_LABEL_PATTERN = DNS_LABEL.pattern
# HAProxy 2.6 runs at most 64 threads (MAX_THREADS on 64-bit builds).
MAX_HAPROXY_THREADS = 64


class Error(Exception):
    """A problem the operator must fix; the message says which and where."""


def split_config_lines(text):
    """(line number, fields) of each line with fields, as SplitConfigLines does.

    Lines end at '\n' only, '#' anywhere starts a comment and fields are separated by
    space, tab and carriage return (not by other white space).
    """
    for number, line in enumerate(text.split("\n"), start=1):
        fields = [f for f in re.split(r"[ \t\r]", line.split("#", 1)[0]) if f]
        if fields:
            yield number, fields


def read_text(path, what):
    try:
        with open(path, "rb") as f:
            # Bytes as they are: a token may hold any byte but the separators.
            return f.read().decode("latin-1")
    except OSError as e:
        raise Error(f"cannot read the {what} {path}: {e.strerror}")


def parse_tokens(text, path):
    """The tenants of a tokens file in the order they first appear."""
    tenants, tokens = [], set()
    for number, fields in split_config_lines(text):
        where = f"tokens file {path}, line {number}"
        if not 2 <= len(fields) <= 3:
            raise Error(f"{where}: expected 'TOKEN TENANT [admin]'")
        if not TENANT_NAME.fullmatch(fields[1]):
            raise Error(f"{where}: a tenant name must be 1 to 64 characters of A-Z a-z 0-9 . _ -")
        if len(fields) == 3 and fields[2] != "admin":
            raise Error(f"{where}: the third field may only be 'admin', not '{fields[2]}'")
        if fields[0] in tokens:
            raise Error(f"{where}: this token is listed on an earlier line too")
        tokens.add(fields[0])
        if fields[1] not in tenants:
            tenants.append(fields[1])
    if not tokens:
        raise Error(f"tokens file {path}, the tokens file lists no tokens (it is empty or only comments), "
                    "so every caller would be refused; add a line 'TOKEN TENANT [admin]'")
    return tenants


def load_tokens(path):
    return parse_tokens(read_text(path, "tokens file"), path)


class Table:
    """A placement table kept line by line, so that rewriting one row keeps the rest."""

    def __init__(self, path, text):
        self.path = path
        self.lines = text.split("\n")
        if self.lines and self.lines[-1] == "":
            self.lines.pop()
        self.problems = []  # malformed rows and duplicates, each naming its line
        self.rows = {}  # tenant -> (replica, index into lines)
        for index, line in enumerate(self.lines):
            body = line[:-1] if line.endswith("\r") else line  # CRLF reads the same to both
            if not body.strip(" \t") or body.lstrip(" \t").startswith("#"):
                continue
            where = f"{path}, line {index + 1}"
            fields = [f for f in re.split(r"[ \t\r]", body) if f]
            if len(fields) != 2 or "#" in body or "\r" in body or body != body.rstrip(" \t"):
                # The server would read some of these; HAProxy reads all the line after the
                # tenant as the replica's name, comments and trailing blanks included.
                self.problems.append(f"{where}: a row must be 'TENANT REPLICA' alone on its line, "
                                     "with no comment or blanks after it")
                continue
            tenant, replica = fields
            if not TENANT_NAME.fullmatch(tenant):
                self.problems.append(f"{where}: '{tenant}' is not a tenant name (1 to 64 characters "
                                     "of A-Z a-z 0-9 . _ -)")
            elif not REPLICA_NAME.fullmatch(replica):
                self.problems.append(f"{where}: '{replica}' is not a replica name (A-Z a-z 0-9 . _ -)")
            elif tenant in self.rows:
                self.problems.append(f"{where}: tenant {tenant} has a row on line "
                                     f"{self.rows[tenant][1] + 1} too")
            else:
                self.rows[tenant] = (replica, index)

    @classmethod
    def load(cls, path, missing_ok=False):
        if missing_ok and not os.path.exists(path):
            return cls(path, "")
        return cls(path, read_text(path, "placement table"))

    def text(self):
        return "".join(line + "\n" for line in self.lines)

    def set(self, tenant, replica):
        row = f"{tenant} {replica}"
        if tenant in self.rows:
            index = self.rows[tenant][1]
            self.lines[index] = row
        else:
            self.lines.append(row)
            index = len(self.lines) - 1
        self.rows[tenant] = (replica, index)

    def save(self):
        """Replaces the file whole, so that a server or HAProxy never reads half of it."""
        directory = os.path.dirname(os.path.abspath(self.path))
        mode = os.stat(self.path).st_mode & 0o777 if os.path.exists(self.path) else 0o644
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".placement.")
        try:
            with os.fdopen(fd, "w", encoding="latin-1") as f:
                f.write(self.text())
            os.chmod(temporary, mode)
            os.replace(temporary, self.path)
        except BaseException:
            os.unlink(temporary)
            raise


def parse_replica_names(value):
    names = [n for n in value.split(",") if n]
    if not names:
        raise Error("--replicas names no replica")
    for n in names:
        if not REPLICA_NAME.fullmatch(n):
            raise Error(f"--replicas: '{n}' is not a replica name (A-Z a-z 0-9 . _ -)")
    if len(set(names)) != len(names):
        raise Error("--replicas names a replica twice")
    return names


def ordinal(name, position):
    """The StatefulSet ordinal of a pod name (gpucompute-3 -> 3), else its position."""
    match = re.search(r"-(\d+)$", name)
    return (int(match.group(1)) if match else position, position)


def problems(table, tenants, replicas):
    """(errors, warnings) of a table against the tokens file's tenants and the replicas."""
    errors = list(table.problems)
    warnings = []
    for tenant, (replica, index) in table.rows.items():
        if replica not in replicas:
            errors.append(f"{table.path}, line {index + 1}: tenant {tenant} is placed on {replica}, "
                          f"which is not a replica ({', '.join(replicas)})")
        if tenant not in tenants:
            warnings.append(f"{table.path}, line {index + 1}: tenant {tenant} is not in the tokens file")
    for tenant in tenants:
        if tenant not in table.rows:
            errors.append(f"{table.path}: tenant {tenant} has no row (placement.py generate adds one)")
    return errors, warnings


def command_generate(args):
    tenants = load_tokens(args.tokens)
    replicas = parse_replica_names(args.replicas)
    table = Table.load(args.table, missing_ok=True)
    # Rows already there are kept even when wrong: fix them by hand, never by moving data.
    errors, warnings = problems(table, [t for t in tenants if t in table.rows], replicas)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if errors:
        raise Error("\n".join(errors + [f"{table.path} is left as it was"]))
    load = {r: 0 for r in replicas}
    for replica, _ in table.rows.values():
        load[replica] += 1
    position = {r: i for i, r in enumerate(replicas)}
    added = 0
    for tenant in tenants:
        if tenant in table.rows:
            continue
        replica = min(replicas, key=lambda r: (load[r], ordinal(r, position[r])))
        table.set(tenant, replica)
        load[replica] += 1
        added += 1
        print(f"{tenant} -> {replica}")
    if added or not os.path.exists(args.table):
        table.save()
    print(f"{args.table}: {len(table.rows)} tenants, {added} added", file=sys.stderr)
    return 0


def parse_sni_suffix(value):
    """The DNS name the SNI route's server names end in, lowercased."""
    suffix = value.lower()
    labels = suffix.split(".")
    if not all(DNS_LABEL.fullmatch(label) for label in labels) or len(suffix) > 253 - 64:
        raise Error(f"--sni-suffix: '{value}' is not a DNS name (labels of a-z 0-9 -, not starting "
                    "or ending with -, joined by dots, leaving room for a tenant's label)")
    return suffix


def sni_problems(table, suffix):
    """The rows whose tenant cannot be named TENANT.SUFFIX on the SNI route."""
    return [f"{table.path}, line {index + 1}: tenant {tenant} is not a DNS label (1 to 63 characters "
            "of a-z 0-9 -, not starting or ending with -), so the SNI route cannot reach it as "
            f"{tenant}.{suffix}; it can use the header route only"
            for tenant, (_, index) in table.rows.items() if not DNS_LABEL.fullmatch(tenant)]


def command_check(args):
    tenants = load_tokens(args.tokens)
    replicas = parse_replica_names(args.replicas)
    table = Table.load(args.table)
    errors, warnings = problems(table, tenants, replicas)
    if args.sni_suffix is not None:
        errors += sni_problems(table, parse_sni_suffix(args.sni_suffix))
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if not errors:
        print(f"{args.table}: every tenant of {args.tokens} has one row on a known replica")
    return 1 if errors else 0


def command_move(args):
    if not TENANT_NAME.fullmatch(args.tenant):
        raise Error(f"'{args.tenant}' is not a tenant name (1 to 64 characters of A-Z a-z 0-9 . _ -)")
    if not REPLICA_NAME.fullmatch(args.replica):
        raise Error(f"'{args.replica}' is not a replica name (A-Z a-z 0-9 . _ -)")
    if args.replicas is not None and args.replica not in parse_replica_names(args.replicas):
        raise Error(f"{args.replica} is not one of --replicas")
    table = Table.load(args.table)
    if table.problems:
        raise Error("\n".join(table.problems + [f"{table.path} is left as it was"]))
    if args.tenant not in table.rows:
        raise Error(f"{args.table}: tenant {args.tenant} has no row to move (placement.py generate "
                    "places a new tenant)")
    before = table.rows[args.tenant][0]
    table.set(args.tenant, args.replica)
    table.save()
    print(f"{args.tenant}: {before} -> {args.replica}")
    return 0


def parse_address(value, flag, any_host=False):
    """HOST:PORT; with any_host, :PORT too (every address, as HAProxy binds it)."""
    host, sep, port = value.rpartition(":")
    if not sep or not (host or any_host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise Error(f"{flag}: '{value}' is not HOST:PORT")
    return value


def parse_replica_addresses(value):
    replicas = []
    for item in (i for i in value.split(",") if i):
        name, sep, address = item.partition("=")
        if not sep:
            raise Error(f"--replicas: '{item}' is not NAME=HOST:PORT")
        replicas.append((name, parse_address(address, "--replicas")))
    parse_replica_names(",".join(name for name, _ in replicas))
    return replicas


def is_ip(host):
    return re.fullmatch(r"[0-9.]+|\[[0-9a-fA-F:.]+\]", host) is not None


def resolver_options(host):
    """A server line's options finding `host` by name, at the start and while running."""
    return "" if is_ip(host) else " resolvers system init-addr last,libc,none"


def grpc_error(status, message):
    """An http-request return answering a gRPC call with an error and no body: HTTP 200
    with grpc-status and grpc-message as headers (gRPC's Trailers-Only response). The
    content type is set by an http-after-response rule: a return without a body drops
    its own."""
    return f"http-request return status 200 hdr grpc-status {status} hdr grpc-message \"{message}\""


def parse_threads(value):
    """--threads: a number of HAProxy threads, as argparse's type (a usage error naming
    the flag otherwise)."""
    if not re.fullmatch(r"[0-9]{1,3}", value) or not 1 <= int(value) <= MAX_HAPROXY_THREADS:
        raise argparse.ArgumentTypeError(
            f"'{value}' is not a number of threads from 1 to {MAX_HAPROXY_THREADS}")
    return int(value)


def haproxy_config(replicas, map_path, listen, tls_cert=None, tls_ca=None, health_listen=None,
                   sni_listen=None, sni_suffix=None, threads=None, busy_poll=False):
    if (tls_cert is None) != (tls_ca is None):
        raise Error("--tls-cert and --tls-ca go together: TLS is served to clients and spoken to the servers")
    if (sni_listen is None) != (sni_suffix is None):
        raise Error("--sni-listen and --sni-suffix go together: the SNI route routes TENANT.SUFFIX")
    if sni_listen is not None and tls_ca is None:
        raise Error("--sni-listen needs --tls-cert and --tls-ca: the SNI route passes TLS through to the "
                    "replicas, so they serve TLS and the header route must speak TLS to them too")
    if busy_poll and threads is None:
        raise Error("--busy-poll needs --threads: busy-polling needs threads on cores of their own, since "
                    "they spin on their CPUs at all times; give HAProxy exclusive CPUs and --threads equal to "
                    "their number")
    if any(c.isspace() or c == '"' for c in map_path):
        raise Error("--map: the path may not hold white space or quotes")
    tenant = f"req.fhdr({TENANT_HEADER})"
    bind_tls = f" ssl crt {tls_cert} alpn h2" if tls_cert else " proto h2"
    out = [
        "# Generated by deploy/placement.py haproxy; regenerate it rather than edit it.",
        "# Routes each gRPC call on its gpucompute-tenant header through the placement",
        f"# table {map_path} to the one replica holding the tenant. No failover: a replica",
        "# that is down is UNAVAILABLE for its own tenants only.",
        "global",
        "    log stdout format raw local0",
        "    # After a reload (SIGUSR2) the old process closes its idle client connections and",
        "    # sends GOAWAY on the busy ones within this time, so that clients' next calls",
        "    # follow the new table; calls in flight finish where they are.",
        "    close-spread-time 5s",
        "    # Larger HTTP/2 windows and buffers keep uploads and downloads at the servers' pace.",
        "    tune.bufsize 65536",
        "    tune.h2.initial-window-size 1048576",
    ]
    if threads is not None:
        out += [
            "    # One thread for each CPU of the proxy's own; the process's CPU set (in",
            "    # Kubernetes, the container's exclusive cores) decides which.",
            f"    nbthread {threads}",
        ]
    if busy_poll:
        out += [
            "    # Threads spin waiting for events instead of sleeping, answering sooner but",
            "    # keeping their cores busy at all times: for cores of the proxy's own only.",
            "    busy-polling",
        ]
    out += [
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlog-normal",
        "    timeout connect 5s",
        "    # gRPC calls may be idle for long: a WaitOperation or a Submit that waits, a",
        "    # Session between requests, a download while the device works. These cut only a",
        "    # call that stays silent for a day; dead peers are found by TCP keepalives.",
        "    timeout client 24h",
        "    timeout server 24h",
        "    timeout http-request 30s",
        "    timeout http-keep-alive 10m",
        "    option clitcpka",
        "    option srvtcpka",
        "    # A request is never resent to another server: each backend has one.",
        "    no option redispatch",
        "",
        "frontend grpc",
        f"    bind {listen}{bind_tls}",
        "    # One header, a tenant name: anything else is not routed (and not echoed).",
        f"    acl tenant_named {tenant} -m reg ^[A-Za-z0-9._-]{{1,64}}$",
        f"    acl tenant_once req.fhdr_cnt({TENANT_HEADER}) eq 1",
        f"    acl tenant_placed {tenant},map_str({map_path}) -m found",
        "    " + grpc_error(3, f"this address routes calls by their {TENANT_HEADER} header, and this call "
                           "has none or a malformed one; set the client's tenant (the CLI's --tenant or "
                           "GPUCOMPUTE_TENANT, the Python client's tenant=, ClientOptions::tenant)") + " if !tenant_once || !tenant_named",
        "    " + grpc_error(9, f"the placement table has no row for tenant %[{tenant}]; add one "
                           "(deploy/placement.py generate) and reload the proxy") + " if !tenant_placed",
        f"    use_backend %[{tenant},map_str({map_path})]",
        "    # A row naming a replica this configuration does not know (a colon in the",
        "    # name, so that no replica's backend has it).",
        "    default_backend placement:unknown-replica",
        "    # The proxy's own answers above are gRPC errors, which need gRPC's content type.",
        "    http-after-response set-header content-type application/grpc "
        "if { res.hdr(grpc-status) -m found } !{ res.hdr(content-type) -m found }",
        "",
        "backend placement:unknown-replica",
        "    " + grpc_error(9, f"the placement table places tenant %[{tenant}] on replica "
                           f"%[{tenant},map_str({map_path})], which this proxy has no backend for; "
                           "regenerate its configuration (deploy/placement.py haproxy)"),
    ]
    server_tls = f" ssl verify required ca-file {tls_ca} alpn h2" if tls_ca else " proto h2"
    names = [address.rpartition(":")[0] for _, address in replicas]
    if not all(is_ip(host) for host in names):
        out += [
            "",
            "# Replicas are found by name when the proxy starts and again while it runs: a",
            "# replica that restarts elsewhere keeps its name, not its address, and one not",
            "# up yet does not keep the proxy from starting.",
            "resolvers system",
            "    parse-resolv-conf",
            "    hold valid 10s",
        ]
    for (name, address), host in zip(replicas, names):
        resolve = resolver_options(host)
        sni = f" sni str({host}) verifyhost {host}" if tls_ca else ""
        out += [
            "",
            f"backend {name}",
            "    # One server and no failover: only this replica holds these tenants' buffers.",
            "    # Once its checks fail, the proxy answers its tenants itself, at once.",
            "    " + grpc_error(14, f"replica {name}, which holds tenant %[{tenant}], is not answering; its "
                               "tenants' calls fail until it is back, other tenants' go on") + " if !{ nbsrv gt 0 }",
            f"    server {name} {address}{server_tls}{sni}{resolve} check inter 2s fall 2 rise 1",
        ]
    if sni_listen is not None:
        out += sni_route(replicas, names, map_path, sni_listen, parse_sni_suffix(sni_suffix))
    if health_listen:
        out += [
            "",
            "# The proxy's own liveness, for probes: answers while HAProxy runs.",
            "frontend health",
            f"    bind {health_listen}",
            "    monitor-uri /healthz",
        ]
    return "\n".join(out) + "\n"


def sni_route(replicas, hosts, map_path, listen, suffix):
    """The TLS-passthrough route: a tcp frontend choosing the replica from the ClientHello's
    server name TENANT.SUFFIX through the same map, and a tcp backend per replica."""
    sni = "req.ssl_sni,lower"
    pattern = f"^{DNS_LABEL_PATTERN}[.]{suffix.replace('.', '[.]')}$"
    out = [
        "",
        "# The SNI route: TLS from client to replica, passed through as bytes. A connection",
        f"# whose ClientHello names TENANT.{suffix} goes to TENANT's replica (the same map);",
        "# any other is closed without an answer, before it reaches a replica.",
        "frontend grpc-sni",
        f"    bind {listen}",
        "    mode tcp",
        "    option tcplog",
        "    # Bytes are moved by the kernel (splice) where that is cheaper than copying.",
        "    option splice-auto",
        "    # The ClientHello is waited for this long; a connection without one is closed.",
        "    tcp-request inspect-delay 5s",
        f"    acl sni_tenant {sni} -m reg {pattern}",
        f"    acl sni_placed {sni},field(1,.),map_str({map_path}) -m found",
        "    tcp-request content accept if { req.ssl_hello_type 1 } sni_tenant sni_placed",
        "    tcp-request content reject",
        f"    use_backend sni:%[{sni},field(1,.),map_str({map_path})]",
        "    # A row naming a replica this configuration has no backend for: closed.",
        "    default_backend sni:unknown-replica",
        "",
        "backend sni:unknown-replica",
        "    mode tcp",
        "    tcp-request content reject",
    ]
    for (name, address), host in zip(replicas, hosts):
        out += [
            "",
            f"backend sni:{name}",
            "    mode tcp",
            "    # A connection carries many calls, some silent for long, as on the header",
            "    # route: only a day without a byte either way closes it.",
            "    timeout tunnel 24h",
            "    # The header route's checks say whether the replica is up: while it is down,",
            "    # its tenants' connections are closed at once.",
            f"    server {name} {address}{resolver_options(host)} track {name}/{name}",
        ]
    return out


def command_haproxy(args):
    replicas = parse_replica_addresses(args.replicas)
    parse_address(args.listen, "--listen", any_host=True)
    if args.health_listen:
        parse_address(args.health_listen, "--health-listen", any_host=True)
    if args.sni_listen:
        parse_address(args.sni_listen, "--sni-listen", any_host=True)
    sys.stdout.write(haproxy_config(replicas, args.map, args.listen, args.tls_cert, args.tls_ca,
                                    args.health_listen, args.sni_listen, args.sni_suffix, args.threads,
                                    args.busy_poll))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("generate", "check"):
        p = commands.add_parser(name)
        p.add_argument("--tokens", required=True, help="the servers' --tokens-file")
        p.add_argument("--replicas", required=True, help="replica names, comma-separated")
        p.add_argument("--table", required=True, help="the placement table")
    commands.choices["check"].add_argument(
        "--sni-suffix", help="also require tenant names that the SNI route can reach as TENANT.SUFFIX")
    p = commands.add_parser("move")
    p.add_argument("tenant")
    p.add_argument("replica")
    p.add_argument("--table", required=True)
    p.add_argument("--replicas", help="refuse a replica not named here")
    p = commands.add_parser("haproxy")
    p.add_argument("--replicas", required=True, help="NAME=HOST:PORT, comma-separated")
    p.add_argument("--map", required=True, help="the placement table's path where HAProxy runs")
    p.add_argument("--listen", required=True, help="ADDR:PORT the proxy serves gRPC on")
    p.add_argument("--tls-cert", help="PEM with the certificate and key served to clients")
    p.add_argument("--tls-ca", help="PEM of the CA that verifies the servers")
    p.add_argument("--health-listen", help="ADDR:PORT of an HTTP /healthz for probes")
    p.add_argument("--sni-listen", help="ADDR:PORT of the TLS-passthrough route (with --sni-suffix)")
    p.add_argument("--sni-suffix", help="DNS name that TENANT.SUFFIX names a tenant under on the SNI route")
    p.add_argument("--threads", type=parse_threads, metavar="N",
                   help=f"HAProxy's threads (nbthread, 1 to {MAX_HAPROXY_THREADS}): the CPUs it is given")
    p.add_argument("--busy-poll", action="store_true",
                   help="threads spin instead of sleeping (busy-polling); needs --threads, on cores of their own")
    args = parser.parse_args(argv)
    handler = {"generate": command_generate, "check": command_check, "move": command_move,
               "haproxy": command_haproxy}[args.command]
    try:
        return handler(args)
    except Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
