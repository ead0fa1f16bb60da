#!/usr/bin/python3
"""Tests of deploy/placement.py and of the HAProxy configuration it writes.

  placement_test.py
      The tool alone: reading tokens files as the server does, generate keeping rows
      and filling new tenants, check's errors, move, the haproxy output.
  placement_test.py --proxy SERVER_BIN
      The configuration in a real HAProxy (`haproxy -c`), and on loopback in front of
      two CPU servers: routing by the gpucompute-tenant header, the proxy's own gRPC
      errors, a dead replica UNAVAILABLE for its tenants only, a 3 GiB upload and a
      30 s WaitOperation that neither the proxy's timeouts nor a reload (a tenant moved)
      cut, a download and a session through it, and the server accepting exactly the
      tokens files the tool accepts. Exit 77 (skipped) without haproxy
      (deploy/install-deps.sh installs it).
"""
import contextlib
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
import placement  # noqa: E402

SKIP = 77
REPLICAS = "gpucompute-0,gpucompute-1"


def run_tool(*argv):
    """(exit status, stdout, stderr) of placement.main."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = placement.main(list(argv))
        except SystemExit as e:
            status = e.code
    return status, out.getvalue(), err.getvalue()


class Files:
    """Files in a temporary directory, for one test."""

    def __init__(self, test):
        self.dir = tempfile.mkdtemp(prefix="placement_test.")
        test.addCleanup(shutil.rmtree, self.dir)

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="latin-1", newline="") as f:
            f.write(text)
        return path

    def read(self, name):
        with open(os.path.join(self.dir, name), encoding="latin-1", newline="") as f:
            return f.read()


# Tokens files and what the server says of each: None where it accepts the file, else
# the message after "tokens file PATH, " (server/tenancy/auth.cc).
TOKENS_CASES = [
    ("t1 alice\nt2 bob admin\n", None),
    ("# comment\n\n  t1\talice \r\nt2 alice # a second token of alice\n", None),
    ("t1 alice\nt1#x bob\n", "line 2: expected 'TOKEN TENANT [admin]'"),
    ("t1 alice\nt1 bob#x\n", "line 2: this token is listed on an earlier line too"),
    ("t1\x0bx alice\n", None),
    ("t1 alice\nt2\n", "line 2: expected 'TOKEN TENANT [admin]'"),
    ("t1 alice admin extra\n", "line 1: expected 'TOKEN TENANT [admin]'"),
    ("t1 alice root\n", "line 1: the third field may only be 'admin', not 'root'"),
    ("t1 al/ice\n", "line 1: a tenant name must be 1 to 64 characters of A-Z a-z 0-9 . _ -"),
    ("t1 " + "a" * 65 + "\n", "line 1: a tenant name must be 1 to 64 characters of A-Z a-z 0-9 . _ -"),
    ("t1 alice\nt1 bob\n", "line 2: this token is listed on an earlier line too"),
    ("# only a comment\n", "the tokens file lists no tokens (it is empty or only comments), so every "
                          "caller would be refused; add a line 'TOKEN TENANT [admin]'"),
]


class TokensTest(unittest.TestCase):
    def test_reads_tokens_as_the_server_does(self):
        files = Files(self)
        for number, (text, server_error) in enumerate(TOKENS_CASES):
            path = files.write(f"tokens{number}", text)
            with self.subTest(text=text):
                if server_error is None:
                    self.assertIsInstance(placement.load_tokens(path), list)
                    continue
                with self.assertRaises(placement.Error) as caught:
                    placement.load_tokens(path)
                self.assertEqual(str(caught.exception), f"tokens file {path}, {server_error}")

    def test_tenants_in_order_of_first_appearance(self):
        files = Files(self)
        path = files.write("tokens", "a carol\nb alice admin\nc carol\nd bob\n")
        self.assertEqual(placement.load_tokens(path), ["carol", "alice", "bob"])

    def test_missing_tokens_file(self):
        status, _, err = run_tool("check", "--tokens", "/nonexistent/tokens", "--replicas", REPLICAS,
                                  "--table", "/nonexistent/table")
        self.assertEqual(status, 1)
        self.assertIn("cannot read the tokens file /nonexistent/tokens", err)


class GenerateTest(unittest.TestCase):
    def setUp(self):
        self.files = Files(self)
        self.tokens = self.files.write("tokens", "t1 alice\nt2 bob\nt3 carol\nt4 dave admin\nt5 erin\n")
        self.table = os.path.join(self.files.dir, "table")

    def generate(self, replicas=REPLICAS):
        return run_tool("generate", "--tokens", self.tokens, "--replicas", replicas, "--table", self.table)

    def test_new_table_spreads_tenants_lowest_ordinal_first(self):
        status, out, _ = self.generate("gpucompute-0,gpucompute-1,gpucompute-2")
        self.assertEqual(status, 0)
        self.assertEqual(self.files.read("table"),
                         "alice gpucompute-0\nbob gpucompute-1\ncarol gpucompute-2\n"
                         "dave gpucompute-0\nerin gpucompute-1\n")
        self.assertIn("erin -> gpucompute-1", out)

    def test_keeps_rows_and_fills_the_emptiest_replica(self):
        # A replica added later (gpucompute-2) takes new tenants; nobody moves.
        original = "# placement\nalice gpucompute-1\n\nbob   gpucompute-1\ncarol gpucompute-0\n"
        self.files.write("table", original)
        status, _, _ = self.generate("gpucompute-0,gpucompute-1,gpucompute-2")
        self.assertEqual(status, 0)
        self.assertEqual(self.files.read("table"), original + "dave gpucompute-2\nerin gpucompute-0\n")

    def test_ordinals_compare_as_numbers(self):
        status, _, _ = self.generate("gpucompute-10,gpucompute-2")
        self.assertEqual(status, 0)
        self.assertTrue(self.files.read("table").startswith("alice gpucompute-2\nbob gpucompute-10\n"))

    def test_unchanged_when_every_tenant_has_a_row(self):
        self.generate()
        before = os.stat(self.table)
        status, out, err = self.generate()
        self.assertEqual(status, 0)
        self.assertEqual(out, "")
        self.assertIn("5 tenants, 0 added", err)
        self.assertEqual(os.stat(self.table).st_ino, before.st_ino)

    def test_refuses_to_write_over_a_wrong_row(self):
        original = "alice gpucompute-7\n"
        self.files.write("table", original)
        status, _, err = self.generate()
        self.assertEqual(status, 1)
        self.assertIn("line 1: tenant alice is placed on gpucompute-7, which is not a replica "
                      "(gpucompute-0, gpucompute-1)", err)
        self.assertIn("is left as it was", err)
        self.assertEqual(self.files.read("table"), original)

    def test_keeps_a_row_of_a_tenant_not_in_the_tokens_file(self):
        self.files.write("table", "frank gpucompute-0\n")
        status, _, err = self.generate()
        self.assertEqual(status, 0)
        self.assertIn("warning: ", err)
        self.assertIn("tenant frank is not in the tokens file", err)
        self.assertTrue(self.files.read("table").startswith("frank gpucompute-0\nalice gpucompute-1\n"))

    def test_bad_replica_names(self):
        for replicas, message in [("", "--replicas names no replica"),
                                  ("gpucompute-0,gpucompute-0", "--replicas names a replica twice"),
                                  ("gpu#0", "'gpu#0' is not a replica name")]:
            with self.subTest(replicas=replicas):
                status, _, err = self.generate(replicas)
                self.assertEqual(status, 1)
                self.assertIn(message, err)
                self.assertFalse(os.path.exists(self.table))


class CheckTest(unittest.TestCase):
    def setUp(self):
        self.files = Files(self)
        self.tokens = self.files.write("tokens", "t1 alice\nt2 bob\n")

    def check(self, table_text):
        table = self.files.write("table", table_text)
        return run_tool("check", "--tokens", self.tokens, "--replicas", REPLICAS, "--table", table)

    def test_a_good_table(self):
        status, out, err = self.check("# c\r\nalice gpucompute-0\r\n  bob\tgpucompute-1\n")
        self.assertEqual(status, 0, err)
        self.assertIn("every tenant of", out)

    def test_errors(self):
        table = self.files.write("table", "")
        cases = [
            ("alice gpucompute-0\n", f"{table}: tenant bob has no row (placement.py generate adds one)"),
            ("alice gpucompute-0\nbob gpucompute-2\n",
             f"{table}, line 2: tenant bob is placed on gpucompute-2, which is not a replica"),
            ("alice gpucompute-0\nbob gpucompute-1\nalice gpucompute-1\n",
             f"{table}, line 3: tenant alice has a row on line 1 too"),
            ("alice gpucompute-0 # first\nbob gpucompute-1\n",
             f"{table}, line 1: a row must be 'TENANT REPLICA' alone on its line"),
            ("alice gpucompute-0 \nbob gpucompute-1\n",
             f"{table}, line 1: a row must be 'TENANT REPLICA' alone on its line"),
            ("alice\nbob gpucompute-1\n", f"{table}, line 1: a row must be 'TENANT REPLICA'"),
            ("al/ice gpucompute-0\nbob gpucompute-1\n", f"{table}, line 1: 'al/ice' is not a tenant name"),
        ]
        for text, message in cases:
            with self.subTest(table=text):
                status, out, err = self.check(text)
                self.assertEqual(status, 1)
                self.assertIn(f"error: {message}", err)
                self.assertEqual(out, "")

    def test_sni_suffix_requires_tenants_that_are_dns_labels(self):
        tokens = self.files.write("tokens", "t1 alice\nt2 Bob\nt3 c.d\nt4 e_f\nt5 -g\nt6 h-9\n")
        table = self.files.write("table", "alice gpucompute-0\nBob gpucompute-1\nc.d gpucompute-0\n"
                                          "e_f gpucompute-1\n-g gpucompute-0\nh-9 gpucompute-1\n")
        status, _, err = run_tool("check", "--tokens", tokens, "--replicas", REPLICAS, "--table", table)
        self.assertEqual(status, 0, err)
        status, out, err = run_tool("check", "--tokens", tokens, "--replicas", REPLICAS, "--table", table,
                                    "--sni-suffix", "GPU.example.test")
        self.assertEqual(status, 1)
        self.assertEqual(out, "")
        refused = [line for line in err.splitlines() if "is not a DNS label" in line]
        self.assertEqual(len(refused), 4, err)
        for line, (number, tenant) in zip(refused, [(2, "Bob"), (3, "c.d"), (4, "e_f"), (5, "-g")]):
            self.assertEqual(line, f"error: {table}, line {number}: tenant {tenant} is not a DNS label (1 to 63 "
                             "characters of a-z 0-9 -, not starting or ending with -), so the SNI route cannot "
                             f"reach it as {tenant}.gpu.example.test; it can use the header route only")
        status, _, err = run_tool("check", "--tokens", tokens, "--replicas", REPLICAS, "--table", table,
                                  "--sni-suffix", "gpu..test")
        self.assertEqual(status, 1)
        self.assertIn("error: --sni-suffix: 'gpu..test' is not a DNS name", err)

    def test_a_tenant_not_in_the_tokens_file_is_a_warning(self):
        status, _, err = self.check("alice gpucompute-0\nbob gpucompute-1\ncarol gpucompute-1\n")
        self.assertEqual(status, 0)
        self.assertIn("line 3: tenant carol is not in the tokens file", err)
        self.assertNotIn("error", err)


class MoveTest(unittest.TestCase):
    def setUp(self):
        self.files = Files(self)
        self.original = "# placement\nalice gpucompute-0\nbob gpucompute-1\n"
        self.table = self.files.write("table", self.original)

    def test_rewrites_one_row(self):
        status, out, _ = run_tool("move", "alice", "gpucompute-2", "--table", self.table)
        self.assertEqual(status, 0)
        self.assertEqual(out, "alice: gpucompute-0 -> gpucompute-2\n")
        self.assertEqual(self.files.read("table"), "# placement\nalice gpucompute-2\nbob gpucompute-1\n")

    def test_refusals_leave_the_table(self):
        cases = [
            (["carol", "gpucompute-0"], "tenant carol has no row to move"),
            (["alice", "gpucompute-2", "--replicas", REPLICAS], "gpucompute-2 is not one of --replicas"),
            (["alice", "gpu 2"], "'gpu 2' is not a replica name"),
            (["a/b", "gpucompute-0"], "'a/b' is not a tenant name"),
        ]
        for argv, message in cases:
            with self.subTest(argv=argv):
                status, _, err = run_tool("move", *argv, "--table", self.table)
                self.assertEqual(status, 1)
                self.assertIn(message, err)
                self.assertEqual(self.files.read("table"), self.original)


def haproxy_config(*extra):
    status, out, err = run_tool("haproxy", "--replicas", "gpucompute-0=10.0.0.1:50051,gpucompute-1=host-1:50051",
                                "--map", "/etc/haproxy/placement", "--listen", ":50051", *extra)
    assert status == 0, err
    return out


def sections(config):
    """{section header: [its lines]} of an HAProxy configuration."""
    result, current = {}, None
    for line in config.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            current = line.strip()
            result[current] = []
        else:
            result[current].append(line.strip())
    return result


class HaproxyConfigTest(unittest.TestCase):
    def test_one_backend_with_one_server_per_replica(self):
        s = sections(haproxy_config())
        backends = {k.split()[1]: v for k, v in s.items() if k.startswith("backend ") and k != "backend placement:unknown-replica"}
        self.assertEqual(sorted(backends), ["gpucompute-0", "gpucompute-1"])
        check = " check inter 2s fall 2 rise 1"
        self.assertEqual(backends["gpucompute-0"][1], f"server gpucompute-0 10.0.0.1:50051 proto h2{check}")
        # A name is resolved again while the proxy runs: a pod that restarts keeps its name.
        self.assertEqual(backends["gpucompute-1"][1],
                         f"server gpucompute-1 host-1:50051 proto h2 resolvers system init-addr last,libc,none{check}")
        self.assertEqual(s["resolvers system"], ["parse-resolv-conf", "hold valid 10s"])
        # A replica whose checks fail: the proxy's own UNAVAILABLE, naming it.
        for name, lines in backends.items():
            self.assertEqual(len(lines), 2)
            self.assertTrue(lines[0].startswith(f'http-request return status 200 hdr grpc-status 14 hdr grpc-message '
                                                f'"replica {name}, which holds tenant '))
            self.assertTrue(lines[0].endswith(" if !{ nbsrv gt 0 }"))
        self.assertNotIn("backup", haproxy_config())

    def test_routes_on_the_tenant_header_through_the_map(self):
        frontend = sections(haproxy_config())["frontend grpc"]
        self.assertIn("bind :50051 proto h2", frontend)
        self.assertIn("use_backend %[req.fhdr(gpucompute-tenant),map_str(/etc/haproxy/placement)]", frontend)
        refusals = [line for line in frontend if line.startswith("http-request return")]
        self.assertEqual(len(refusals), 2)
        self.assertTrue(refusals[0].startswith("http-request return status 200 hdr grpc-status 3 "))
        self.assertTrue(refusals[0].endswith(" if !tenant_once || !tenant_named"))
        self.assertIn('hdr grpc-message "the placement table has no row for tenant '
                      '%[req.fhdr(gpucompute-tenant)]; ', refusals[1])
        self.assertTrue(refusals[1].endswith(" if !tenant_placed"))

    def test_timeouts_do_not_cut_long_calls(self):
        defaults = sections(haproxy_config())["defaults"]
        for side in ("client", "server"):
            self.assertIn(f"timeout {side} 24h", defaults)
        self.assertFalse(any("tunnel" in line or "http-buffer-request" in line for line in defaults))

    def test_tls(self):
        config = haproxy_config("--tls-cert", "/tls/proxy.pem", "--tls-ca", "/tls/ca.pem")
        s = sections(config)
        self.assertIn("bind :50051 ssl crt /tls/proxy.pem alpn h2", s["frontend grpc"])
        self.assertEqual(s["backend gpucompute-1"][1],
                         "server gpucompute-1 host-1:50051 ssl verify required ca-file /tls/ca.pem alpn h2 "
                         "sni str(host-1) verifyhost host-1 resolvers system init-addr last,libc,none "
                         "check inter 2s fall 2 rise 1")

    def test_sni_route(self):
        tls = ("--tls-cert", "/tls/proxy.pem", "--tls-ca", "/tls/ca.pem")
        default = haproxy_config(*tls)
        self.assertNotIn("mode tcp", default)
        config = haproxy_config(*tls, "--sni-listen", ":50052", "--sni-suffix", "Gpu.Example.test")
        # The header route is as it was without the SNI route.
        self.assertTrue(config.startswith(default))
        s = sections(config)
        lookup = "req.ssl_sni,lower,field(1,.),map_str(/etc/haproxy/placement)"
        self.assertEqual(s["frontend grpc-sni"], [
            "bind :50052", "mode tcp", "option tcplog", "option splice-auto", "tcp-request inspect-delay 5s",
            "acl sni_tenant req.ssl_sni,lower -m reg "
            "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?[.]gpu[.]example[.]test$",
            f"acl sni_placed {lookup} -m found",
            "tcp-request content accept if { req.ssl_hello_type 1 } sni_tenant sni_placed",
            "tcp-request content reject",
            f"use_backend sni:%[{lookup}]",
            "default_backend sni:unknown-replica"])
        self.assertEqual(s["backend sni:unknown-replica"], ["mode tcp", "tcp-request content reject"])
        self.assertEqual(s["backend sni:gpucompute-0"], [
            "mode tcp", "timeout tunnel 24h", "server gpucompute-0 10.0.0.1:50051 track gpucompute-0/gpucompute-0"])
        self.assertEqual(s["backend sni:gpucompute-1"], [
            "mode tcp", "timeout tunnel 24h",
            "server gpucompute-1 host-1:50051 resolvers system init-addr last,libc,none "
            "track gpucompute-1/gpucompute-1"])

    def test_threads_and_busy_polling(self):
        default = sections(haproxy_config())["global"]
        self.assertFalse(any(line.startswith(("nbthread", "busy-polling", "cpu-map")) for line in default))
        # The lines come after the global section's own, which stay as they were.
        self.assertEqual(sections(haproxy_config("--threads", "1"))["global"], default + ["nbthread 1"])
        self.assertEqual(sections(haproxy_config("--threads", "64", "--busy-poll"))["global"],
                         default + ["nbthread 64", "busy-polling"])
        # No cpu-map: the process's CPU set decides the cores.
        self.assertNotIn("cpu-map", haproxy_config("--threads", "4", "--busy-poll"))

    def test_bad_threads_are_a_usage_error(self):
        for value in ("0", "65", "-1", "four", "4.0", "", "\u00b2"):
            with self.subTest(value=value):
                status, out, err = run_tool("haproxy", "--replicas", "a=h:1", "--map", "m", "--listen", ":1",
                                            "--threads", value)
                self.assertEqual(status, 2)
                # argparse's usage error, after the program's name.
                self.assertEqual(err.splitlines()[-1].split(" ", 1)[1], f"haproxy: error: argument --threads: "
                                                                         f"'{value}' is not a number of threads "
                                                                         "from 1 to 64")
                self.assertEqual(out, "")

    def test_busy_poll_needs_threads(self):
        status, out, err = run_tool("haproxy", "--replicas", "a=h:1", "--map", "m", "--listen", ":1", "--busy-poll")
        self.assertEqual(status, 1)
        self.assertEqual(err, "error: --busy-poll needs --threads: busy-polling needs threads on cores of their "
                              "own, since they spin on their CPUs at all times; give HAProxy exclusive CPUs and "
                              "--threads equal to their number\n")
        self.assertEqual(out, "")

    def test_haproxy_accepts_threads_and_busy_polling(self):
        haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
        if haproxy is None:
            self.skipTest("haproxy is not installed (deploy/install-deps.sh installs it)")
        files = Files(self)
        table = files.write("placement", "alice gpucompute-0\n")
        for extra in (["--threads", "4", "--busy-poll"], ["--threads", "64"]):
            with self.subTest(extra=extra):
                status, config, err = run_tool("haproxy", "--replicas", "gpucompute-0=127.0.0.1:1", "--map", table,
                                               "--listen", "127.0.0.1:2", *extra)
                self.assertEqual(status, 0, err)
                checked = subprocess.run([haproxy, "-c", "-f", files.write("haproxy.cfg", config)],
                                         capture_output=True, text=True)
                output = checked.stdout + checked.stderr
                self.assertEqual(checked.returncode, 0, output)
                self.assertNotIn("[WARNING]", output)
                self.assertNotIn("[ALERT]", output)

    def test_bad_arguments(self):
        cases = [
            (["--replicas", "gpucompute-0", "--map", "m", "--listen", ":1"], "'gpucompute-0' is not NAME=HOST:PORT"),
            (["--replicas", "a=h:0", "--map", "m", "--listen", ":1"], "'h:0' is not HOST:PORT"),
            (["--replicas", "a=h:1", "--map", "m", "--listen", "1"], "--listen: '1' is not HOST:PORT"),
            (["--replicas", "a=h:1,a=g:1", "--map", "m", "--listen", ":1"], "--replicas names a replica twice"),
            (["--replicas", "a=h:1", "--map", "m m", "--listen", ":1"], "--map: the path may not hold"),
            (["--replicas", "a=h:1", "--map", "m", "--listen", ":1", "--tls-cert", "c"],
             "--tls-cert and --tls-ca go together"),
            (["--replicas", "a=h:1", "--map", "m", "--listen", ":1", "--sni-listen", ":2"],
             "--sni-listen and --sni-suffix go together"),
            (["--replicas", "a=h:1", "--map", "m", "--listen", ":1", "--sni-listen", ":2", "--sni-suffix", "s"],
             "--sni-listen needs --tls-cert and --tls-ca: the SNI route passes TLS through"),
            (["--replicas", "a=h:1", "--map", "m", "--listen", ":1", "--tls-cert", "c", "--tls-ca", "a",
              "--sni-listen", "2", "--sni-suffix", "s"], "--sni-listen: '2' is not HOST:PORT"),
            (["--replicas", "a=h:1", "--map", "m", "--listen", ":1", "--tls-cert", "c", "--tls-ca", "a",
              "--sni-listen", ":2", "--sni-suffix", "s_t"], "--sni-suffix: 's_t' is not a DNS name"),
        ]
        for argv, message in cases:
            with self.subTest(argv=argv):
                status, out, err = run_tool("haproxy", *argv)
                self.assertEqual(status, 1)
                self.assertIn(message, err)
                self.assertEqual(out, "")


class Process:
    """A program whose stderr goes to a file, ended (SIGKILL) at cleanup."""

    def __init__(self, test, argv, log):
        self.log = log
        with open(log, "wb") as f:
            self.process = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        test.addCleanup(self.kill)

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def output(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def wait_for(self, pattern, seconds=20):
        """The first match of `pattern` in the output, or None once the program has exited."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output())
            if match or self.process.poll() is not None:
                return re.search(pattern, self.output())
            time.sleep(0.05)
        raise AssertionError(f"no '{pattern}' within {seconds} s in {self.log}:\n{self.output()}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProxyTest(unittest.TestCase):
    """HAProxy with the generated configuration in front of two CPU servers, on loopback."""

    server_bin = None
    haproxy = None

    def start_server(self, name, *flags):
        server = Process(self, [self.server_bin, "--backend=cpu", "--listen=127.0.0.1:0", "--log-format=text",
                                *flags], os.path.join(self.files.dir, f"{name}.log"))
        match = server.wait_for(r"listening on port (\d+)")
        self.assertIsNotNone(match, server.output())
        return server, f"127.0.0.1:{match.group(1)}"

    def test_the_server_accepts_exactly_the_tokens_files_the_tool_accepts(self):
        self.files = Files(self)
        for number, (text, server_error) in enumerate(TOKENS_CASES):
            path = self.files.write(f"tokens{number}", text)
            with self.subTest(text=text):
                server = Process(self, [self.server_bin, "--backend=cpu", "--listen=127.0.0.1:0",
                                        f"--tokens-file={path}", "--log-format=text"],
                                 os.path.join(self.files.dir, f"server{number}.log"))
                serving = server.wait_for(r"listening on port \d+")
                server.kill()
                if server_error is None:
                    self.assertIsNotNone(serving, server.output())
                    placement.load_tokens(path)
                else:
                    self.assertIsNone(serving)
                    self.assertIn(f"tokens file {path}, {server_error}", server.output())
                    with self.assertRaises(placement.Error):
                        placement.load_tokens(path)

    def test_routing_errors_failure_and_long_calls(self):
        import grpc
        sys.path.insert(0, os.path.join(ROOT, "client", "python"))
        from gpucompute._proto import v1

        self.files = Files(self)
        tokens = self.files.write("tokens", "token-alice alice\ntoken-bob bob\ntoken-carol carol\n")
        # dave has no row, and zed's names a replica the proxy does not know.
        table = self.files.write("placement", "alice gpucompute-0\nbob gpucompute-1\ncarol gpucompute-0\n"
                                              "zed gpucompute-7\n")
        servers, addresses = {}, {}
        for replica in REPLICAS.split(","):
            servers[replica], addresses[replica] = self.start_server(
                replica, f"--tokens-file={tokens}", "--memory-limit=4GiB", "--max-reserved-fraction-per-tenant=1",
                "--cpu-threads=1")
        listen = f"127.0.0.1:{free_port()}"
        status, config, err = run_tool("haproxy", "--replicas", ",".join(f"{r}={a}" for r, a in addresses.items()),
                                       "--map", table, "--listen", listen)
        self.assertEqual(status, 0, err)
        config_path = self.files.write("haproxy.cfg", config)
        checked = subprocess.run([self.haproxy, "-dW", "-c", "-f", config_path], capture_output=True, text=True)
        self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)
        proxy = Process(self, [self.haproxy, "-W", "-db", "-f", config_path], os.path.join(self.files.dir, "haproxy.log"))
        self.assertIsNotNone(proxy.wait_for("Loading success"), proxy.output())

        options = [("grpc.max_send_message_length", 80 << 20), ("grpc.max_receive_message_length", 80 << 20)]
        channels = {name: grpc.insecure_channel(address, options=options)
                    for name, address in [("proxy", listen), *addresses.items()]}
        # A connection of its own (not shared with "proxy"), idle when the proxy reloads.
        channels["proxy-idle"] = grpc.insecure_channel(listen, options=options + [("grpc.use_local_subchannel_pool", 1)])
        for channel in channels.values():
            self.addCleanup(channel.close)

        def method(where, service, name, response, kind="unary_unary"):
            return getattr(channels[where], kind)(f"/gpucompute.v1.{service}/{name}",
                                                  request_serializer=lambda m: m.SerializeToString(),
                                                  response_deserializer=response.FromString)

        def metadata(tenant, header=True):
            return [("authorization", f"Bearer token-{tenant}")] + ([("gpucompute-tenant", tenant)] if header else [])

        def create(where, tenant, name, shape=(4,), fill=1.0, header=True):
            request = v1.CreateBufferRequest(dtype=v1.DTYPE_FLOAT32, shape=shape, name=name,
                                             fill=v1.Scalar(float_value=fill))
            return method(where, "BufferService", "CreateBuffer", v1.CreateBufferResponse)(
                request, metadata=metadata(tenant, header), timeout=30).buffer

        def names(where, tenant):
            response = method(where, "BufferService", "ListBuffers", v1.ListBuffersResponse)(
                v1.ListBuffersRequest(), metadata=metadata(tenant), timeout=10)
            return sorted(b.name for b in response.buffers)

        def refused(call, code, message):
            with self.assertRaises(grpc.RpcError) as caught:
                call()
            self.assertEqual((caught.exception.code(), caught.exception.details()), (code, message))

        # Each tenant's call lands on the replica its row names.
        create("proxy", "alice", "a1")
        create("proxy", "bob", "b1")
        create("proxy-idle", "carol", "c1")
        self.assertEqual(names("gpucompute-0", "alice"), ["a1"])
        self.assertEqual(names("gpucompute-1", "alice"), [])
        self.assertEqual(names("gpucompute-1", "bob"), ["b1"])
        self.assertEqual(names("gpucompute-0", "bob"), [])

        # The proxy's own answers: no header, a malformed one, two, a tenant without a row.
        no_header = ("this address routes calls by their gpucompute-tenant header, and this call has none or "
                     "a malformed one; set the client's tenant (the CLI's --tenant or GPUCOMPUTE_TENANT, the "
                     "Python client's tenant=, ClientOptions::tenant)")
        refused(lambda: create("proxy", "alice", "x", header=False), grpc.StatusCode.INVALID_ARGUMENT, no_header)
        for bad in (["al ice"], ["alice", "alice"], ["a" * 65], [""]):
            refused(lambda: method("proxy", "BufferService", "CreateBuffer", v1.CreateBufferResponse)(
                v1.CreateBufferRequest(dtype=v1.DTYPE_FLOAT32, shape=[4], name="x"),
                metadata=metadata("alice", header=False) + [("gpucompute-tenant", t) for t in bad], timeout=10),
                grpc.StatusCode.INVALID_ARGUMENT, no_header)
        refused(lambda: create("proxy", "dave", "x"), grpc.StatusCode.FAILED_PRECONDITION,
                "the placement table has no row for tenant dave; add one (deploy/placement.py generate) and "
                "reload the proxy")
        refused(lambda: create("proxy", "zed", "x"), grpc.StatusCode.FAILED_PRECONDITION,
                "the placement table places tenant zed on replica gpucompute-7, which this proxy has no backend "
                "for; regenerate its configuration (deploy/placement.py haproxy)")
        for replica in addresses:
            for tenant in ("alice", "bob", "carol"):
                self.assertNotIn("x", names(replica, tenant))

        # A 3 GiB upload and a 30 s WaitOperation through the proxy, at the same time.
        def chunks(size, chunk=4 << 20):
            yield v1.UploadRequest(header=v1.UploadHeader(
                create=v1.CreateBufferRequest(dtype=v1.DTYPE_INT32, shape=[size // 4], name="big"), size_bytes=size))
            data = bytes(range(256)) * (chunk // 256)
            for _ in range(size // chunk):
                yield v1.UploadRequest(chunk=data)

        upload = {}

        def run_upload():
            try:
                upload["response"] = method("proxy", "BufferService", "Upload", v1.UploadResponse,
                                            "stream_unary")(chunks(3 << 30), metadata=metadata("bob"), timeout=120)
            except grpc.RpcError as e:
                upload["error"] = e
        uploader = threading.Thread(target=run_upload, daemon=True)
        uploader.start()

        # Matmuls queued on one stream of a one-thread server outlast the 30 s wait: about
        # two minutes of them, as long as one takes here once warm. The timed ones share
        # the cores with the upload above, so they may take twice as long as the queued
        # ones will, and the first also starts the BLAS's threads; a minute's worth by
        # the first one's time ran out before the wait did on a busy 2-core machine.
        a = create("proxy", "alice", "a", shape=(2048, 2048)).id
        c = create("proxy", "alice", "c", shape=(2048, 2048)).id
        submit = method("proxy", "OperationService", "Submit", v1.Operation)
        one = min(submit(v1.SubmitRequest(matmul=v1.MatmulOp(a=a, b=a, c=v1.Output(buffer=c)), wait=True),
                         metadata=metadata("alice"), timeout=60).timing.device_seconds for _ in range(3))
        for _ in range(min(2000, int(120 / max(one, 0.01)) + 1)):
            last = submit(v1.SubmitRequest(matmul=v1.MatmulOp(a=a, b=a, c=v1.Output(buffer=c))),
                          metadata=metadata("alice"), timeout=30)
        wait = {}

        def run_wait():
            started = time.monotonic()
            try:
                wait["response"] = method("proxy", "OperationService", "WaitOperation", v1.Operation)(
                    v1.WaitOperationRequest(operation_id=last.id, timeout_seconds=30), metadata=metadata("alice"),
                    timeout=60)
            except grpc.RpcError as e:
                wait["error"] = e
            wait["seconds"] = time.monotonic() - started
        waiter = threading.Thread(target=run_wait, daemon=True)
        waiter.start()

        # While both are under way, carol moves to gpucompute-1 and the proxy reloads: the
        # calls in flight go on, and the next call on a connection that was idle follows
        # the new table (the old process closes it).
        time.sleep(1)
        self.assertEqual(names("proxy-idle", "carol"), ["c1"])
        self.assertEqual(run_tool("move", "carol", "gpucompute-1", "--table", table)[0], 0)
        proxy.process.send_signal(signal.SIGUSR2)
        time.sleep(7)  # close-spread-time, and a margin
        create("proxy-idle", "carol", "c-moved")
        self.assertEqual(names("gpucompute-1", "carol"), ["c-moved"])
        self.assertEqual(names("gpucompute-0", "carol"), ["c1"])

        waiter.join()
        self.assertNotIn("error", wait)
        self.assertFalse(wait["response"].done, "the matmuls ended before the wait did; the wait proves nothing")
        self.assertGreaterEqual(wait["seconds"], 29.5)
        uploader.join()
        self.assertNotIn("error", upload)
        self.assertEqual(upload["response"].buffer.size_bytes, 3 << 30)
        self.assertEqual(names("gpucompute-1", "bob"), ["b1", "big"])

        # A download (server stream) of the upload's last 8 MiB, and a session
        # (bidirectional) that is silent between its requests.
        download = method("proxy", "BufferService", "Download", v1.DownloadResponse, "unary_stream")(
            v1.DownloadRequest(buffer="big", offset_bytes=(3 << 30) - (8 << 20), size_bytes=8 << 20),
            metadata=metadata("bob"), timeout=60)
        self.assertEqual(b"".join(r.data for r in download), bytes(range(256)) * (8 << 12))
        requests = [v1.SessionRequest(ops=[v1.ChainStep(tag=f"double{i}", op=v1.SubmitRequest(
            elementwise=v1.ElementwiseOp(expression="2 * x", inputs={"x": v1.Operand(buffer="b1")},
                                         output=v1.Output(name=f"b1x{i}"))))]) for i in range(2)]
        answered = threading.Event()

        def session_requests():
            yield requests[0]
            answered.wait(30)
            time.sleep(2)
            yield requests[1]
        session = method("proxy", "SessionService", "Session", v1.SessionResponse, "stream_stream")(
            session_requests(), metadata=metadata("bob"), timeout=60)
        tags = []
        for response in session:
            tags += [a.tag for a in response.answers if a.operation.state == v1.Operation.STATE_SUCCEEDED]
            answered.set()
            if len(tags) == 2:
                break
        session.cancel()
        self.assertEqual(tags, ["double0", "double1"])
        self.assertEqual(names("gpucompute-1", "bob"), ["b1", "b1x0", "b1x1", "big"])
        self.assertEqual(names("gpucompute-0", "alice"), ["a", "a1", "c"])

        # A dead replica is UNAVAILABLE for its own tenants; the others go on.
        # Until the proxy's checks notice, its own HTTP 503; then its gRPC answer.
        servers["gpucompute-1"].kill()
        down = ("replica gpucompute-1, which holds tenant bob, is not answering; its tenants' calls fail until "
                "it is back, other tenants' go on")
        deadline = time.monotonic() + 10
        while True:
            with self.assertRaises(grpc.RpcError) as caught:
                create("proxy", "bob", "b2")
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
            if caught.exception.details() == down or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        self.assertEqual(caught.exception.details(), down)
        create("proxy", "alice", "a2")
        self.assertEqual(names("gpucompute-0", "alice"), ["a", "a1", "a2", "c"])


def proxy_main(argv):
    if len(argv) != 1:
        print(__doc__)
        return 2
    ProxyTest.server_bin = argv[0]
    ProxyTest.haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if ProxyTest.haproxy is None:
        print("SKIPPED: haproxy is not installed (deploy/install-deps.sh installs it)")
        return SKIP
    try:
        import grpc  # noqa: F401
    except ImportError:
        print("SKIPPED: python3-grpcio is not installed (deploy/install-deps.sh installs it)")
        return SKIP
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(ProxyTest)
    return 0 if unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful() else 1


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--proxy":
        return proxy_main(sys.argv[2:])
    loader = unittest.defaultTestLoader
    suite = unittest.TestSuite(loader.loadTestsFromTestCase(c) for c in
                               (TokensTest, GenerateTest, CheckTest, MoveTest, HaproxyConfigTest))
    return 0 if unittest.TextTestRunner(verbosity=1).run(suite).wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
