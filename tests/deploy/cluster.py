"""Servers placed by tenant behind HAProxy, all on loopback: what the sharded test and
bench/proxy_bench.py start.

Replica i is a gpucompute-server program started with --replica-name, the placement
file and every replica's address; HAProxy runs the configuration that
deploy/placement.py writes, in the foreground, and reloads as an operator would (a new
process taking over with -sf). Either may be pinned to CPUs (cpus=, a taskset list such
as "0-3,8"), as bench/proxy_bench.py does to give each process cores of its own.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time


_handed_out = set()


def free_port():
    """A loopback port nothing listens on now, and never one this process was given
    before: the kernel may hand a just-closed port out again, and the replicas' ports
    are all chosen before any of them starts."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def wait_for_port(port, timeout, process=None):
    """Waits until something accepts connections on `port`; False if `process` exits or
    `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def pinned(argv, cpus):
    """`argv`, run on the CPUs `cpus` (a taskset list, e.g. "0-3,8") when that is not
    None. taskset execs the program, so the process started is the program itself and
    its signals reach it."""
    if cpus is None:
        return list(argv)
    taskset = shutil.which("taskset")
    if taskset is None:
        raise RuntimeError("pinning to CPUs needs taskset (util-linux)")
    return [taskset, "-c", cpus, *argv]


def stop_process(process, timeout):
    """SIGTERM, then SIGKILL if `process` is still there after `timeout` seconds."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Replica:
    """One gpucompute-server: `name`, its port, its persist directory and its flags; on
    the CPUs `cpus` (a taskset list) when given."""

    def __init__(self, server_bin, name, port, workdir, flags, env=None, persist=True, cpus=None):
        self.server_bin = server_bin
        self.name = name
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.persist_dir = os.path.join(workdir, f"persist-{name}") if persist else None
        self.log = os.path.join(workdir, f"{name}.log")
        self.flags = list(flags)
        self.env = env
        self.cpus = cpus
        self.process = None

    def start(self, timeout=60):
        with open(self.log, "ab") as log:
            start_of_run = log.tell()  # a restart appends to the log of the run before
            persist = [f"--persist-dir={self.persist_dir}"] if self.persist_dir else []
            self.process = subprocess.Popen(
                pinned([self.server_bin, f"--listen={self.address}", f"--replica-name={self.name}"] +
                       persist + self.flags, self.cpus), stdout=log, stderr=log, env=self.env)
        # Its log says when it listens: a port that accepts could be another program's.
        deadline = time.monotonic() + timeout
        while f"listening on port {self.port}".encode() not in self._log_bytes(start_of_run):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start; its log:\n{self.read_log()}")
            time.sleep(0.05)

    def read_log(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def _log_bytes(self, start):
        with open(self.log, "rb") as f:
            f.seek(start)
            return f.read()

    def kill9(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def reload(self):
        """SIGHUP: the server re-reads the tokens file and the placement file."""
        self.process.send_signal(signal.SIGHUP)

    def stop(self):
        stop_process(self.process, 30)


class Placement:
    """deploy/placement.py on the table file `table`."""

    def __init__(self, deploy_dir, table):
        self.tool = os.path.join(deploy_dir, "placement.py")
        self.table = table

    def run(self, *args):
        result = subprocess.run([sys.executable, self.tool, *args], capture_output=True,
                                text=True)
        if result.returncode != 0:
            raise RuntimeError(f"placement.py {' '.join(args)}: exit {result.returncode}\n"
                               f"{result.stdout}{result.stderr}")
        return result.stdout

    def generate(self, tokens, replicas):
        self.run("generate", "--tokens", tokens, "--replicas", ",".join(replicas),
                 "--table", self.table)
        self.run("check", "--tokens", tokens, "--replicas", ",".join(replicas),
                 "--table", self.table)

    def move(self, tenant, replica):
        self.run("move", tenant, replica, "--table", self.table)

    def rows(self):
        """The table as {tenant: replica}."""
        rows = {}
        with open(self.table) as f:
            for line in f:
                fields = line.split()
                if fields and not fields[0].startswith("#"):
                    rows[fields[0]] = fields[1]
        return rows

    def haproxy_config(self, replicas, listen, *extra):
        """The configuration for `replicas` ({name: address}) listening on `listen`;
        `extra` are more arguments of placement.py haproxy (TLS, the SNI route)."""
        return self.run("haproxy", "--replicas",
                        ",".join(f"{name}={address}" for name, address in replicas.items()),
                        "--map", self.table, "--listen", listen, *extra)


class Certificates:
    """A test CA and one certificate, signed by it, for every replica and the proxy: valid
    for *.SUFFIX (the SNI route's names), localhost and 127.0.0.1. Made by openssl in
    `directory`, as tests/testdata/tls/generate.sh makes the committed ones. The key is
    also written as CERT.key, where HAProxy looks for it. 127.0.0.1 is a DNS name too:
    HAProxy 2.6's verifyhost, which checks the replicas on the header route, reads DNS
    names only."""

    def __init__(self, directory, suffix):
        self.ca = os.path.join(directory, "ca.pem")
        self.cert = os.path.join(directory, "replica.pem")
        self.key = os.path.join(directory, "replica.key")
        ca_key, csr, extensions = (os.path.join(directory, n) for n in ("ca.key", "replica.csr",
                                                                         "replica.ext"))
        with open(extensions, "w") as f:
            f.write(f"subjectAltName=DNS:*.{suffix},DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1\n"
                    "extendedKeyUsage=serverAuth\n")
        for argv in (
                ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-subj", "/CN=gpucompute test CA", "-keyout", ca_key, "-out", self.ca],
                ["req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=*.{suffix}",
                 "-keyout", self.key, "-out", csr],
                ["x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", ca_key, "-CAcreateserial",
                 "-days", "2", "-extfile", extensions, "-out", self.cert]):
            subprocess.run(["openssl", *argv], check=True, capture_output=True)
        shutil.copy(self.key, self.cert + ".key")


def find_haproxy():
    """The haproxy program, or None; Debian installs it in /usr/sbin, which a user's PATH
    may not hold."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


class HAProxy:
    """haproxy in the foreground (-db) on a configuration file, on the CPUs `cpus` (a
    taskset list) when given; reload() starts a new process on the file's current
    contents that takes over from the old one (-sf)."""

    def __init__(self, config_path, port, log, cpus=None):
        self.program = find_haproxy()
        self.config_path = config_path
        self.port = port
        self.log = log
        self.cpus = cpus
        self.process = None

    def _spawn(self, extra):
        with open(self.log, "ab") as log:
            return subprocess.Popen(pinned([self.program, "-db", "-f", self.config_path] + extra,
                                           self.cpus), stdout=log, stderr=log)

    def start(self, timeout=30):
        check = subprocess.run([self.program, "-c", "-f", self.config_path], capture_output=True,
                               text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c refused the configuration:\n{check.stdout}"
                               f"{check.stderr}")
        self.process = self._spawn([])
        if not wait_for_port(self.port, timeout, self.process):
            raise RuntimeError(f"haproxy did not start; its log:\n{self.read_log()}")

    def reload(self, timeout=30):
        old = self.process
        self.process = self._spawn(["-sf", str(old.pid)])
        try:
            old.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_process(old, 0)
        if self.process.poll() is not None or not wait_for_port(self.port, timeout):
            raise RuntimeError(f"haproxy did not reload; its log:\n{self.read_log()}")

    def read_log(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def stop(self):
        stop_process(self.process, 10)
