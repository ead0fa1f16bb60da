#!/usr/bin/python3
"""Tests of bench/proxy_bench.py's pinning (--cpus, --busy-poll) and of cluster.py's
taskset prefix: the CPU plans it accepts and refuses, `auto` on a few machine shapes
(a fake sysfs topology), HAProxy's lines for its set accepted by `haproxy -c` (where
haproxy is installed), and a pinned process really confined to its CPUs (where taskset
is installed). No server is started.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
import proxy_bench  # noqa: E402  (also puts tests/deploy, for cluster, on the path)
import cluster  # noqa: E402
import placement  # noqa: E402

ROLES = proxy_bench.CPU_ROLES


def fake_topology(test, cores):
    """A directory laid out as /sys/devices/system/cpu for `cores`, lists of the CPUs of
    each physical core."""
    root = tempfile.mkdtemp(prefix="proxy_bench_test.")
    test.addCleanup(shutil.rmtree, root)
    for core in cores:
        for cpu in core:
            os.makedirs(os.path.join(root, f"cpu{cpu}", "topology"))
            with open(os.path.join(root, f"cpu{cpu}", "topology", "thread_siblings_list"), "w") as f:
                f.write(",".join(map(str, core)) + "\n")
    return root


class CpuListTest(unittest.TestCase):
    def test_lists_read_and_written_as_taskset_does(self):
        self.assertEqual(proxy_bench.parse_cpu_list("0-3,8,10-11"), [0, 1, 2, 3, 8, 10, 11])
        self.assertEqual(proxy_bench.parse_cpu_list("5,1,1-2"), [1, 2, 5])
        self.assertEqual(proxy_bench.cpu_list([0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11")
        self.assertEqual(proxy_bench.cpu_ranges([7]), ["7"])

    def test_malformed_lists_refused(self):
        for text, item in (("3-1", "3-1"), ("a", "a"), ("1,", ""), ("-2", "-2"), ("1-", "1-")):
            with self.subTest(text=text):
                with self.assertRaises(ValueError) as e:
                    proxy_bench.parse_cpu_list(text)
                self.assertEqual(str(e.exception), f"'{item}' is not a CPU number or a range N-M")


class ExplicitPlanTest(unittest.TestCase):
    online = list(range(32))

    def test_each_role_gets_its_set(self):
        plan, warning = proxy_bench.parse_cpu_plan(
            "replica0=0-7,replica1=8-15,haproxy=16-19,client=20-27", self.online)
        self.assertEqual(plan, {"replica0": list(range(0, 8)), "replica1": list(range(8, 16)),
                                "haproxy": list(range(16, 20)), "client": list(range(20, 28))})
        self.assertIsNone(warning)

    def test_a_set_may_hold_commas(self):
        plan, warning = proxy_bench.parse_cpu_plan(
            "replica0=0-1,16-17,replica1=2,18,haproxy=4-5,client=6", self.online)
        self.assertEqual(plan["replica0"], [0, 1, 16, 17])
        self.assertEqual(plan["replica1"], [2, 18])
        self.assertIsNone(warning)

    def test_overlapping_sets_are_a_warning(self):
        plan, warning = proxy_bench.parse_cpu_plan(
            "replica0=0-1,replica1=2-3,haproxy=3-4,client=0", self.online)
        self.assertEqual(plan["haproxy"], [3, 4])
        self.assertEqual(warning, "the sets share CPUs 0,3: the processes on them compete")

    def test_mistakes_refused(self):
        cases = {
            "replica0=0,replica1=1": "no CPUs for haproxy, client (every one of replica0, replica1, "
                                     "haproxy, client needs a set)",
            "replica0=0,server=1": "'server' is not one of replica0, replica1, haproxy, client",
            "0,replica0=1": "'0' follows no ROLE= (e.g. replica0=0-7)",
            "replica0=0,replica0=1": "replica0 is given twice",
            "replica0=0,replica1=1,haproxy=2,client=30-33":
                "client: CPUs 32-33 are not among the CPUs this process may use (0-31)",
            "replica0=0,replica1=1,haproxy=x,client=3": "'x' is not a CPU number or a range N-M",
        }
        for value, message in cases.items():
            with self.subTest(value=value):
                with self.assertRaises(ValueError) as e:
                    proxy_bench.parse_cpu_plan(value, self.online)
                self.assertEqual(str(e.exception), message)

    def test_haproxy_at_most_its_thread_limit(self):
        with self.assertRaises(ValueError) as e:
            proxy_bench.parse_cpu_plan("replica0=0,replica1=1,haproxy=2-66,client=67",
                                       list(range(68)))
        self.assertEqual(str(e.exception), "haproxy: 65 CPUs, more than HAProxy's 64 threads")


class AutoPlanTest(unittest.TestCase):
    def test_whole_cores_each_set_disjoint(self):
        # 16 cores of two hyperthreads, numbered as Linux does: CPU c and c + 16.
        topology = fake_topology(self, [[c, c + 16] for c in range(16)])
        plan, warning = proxy_bench.auto_cpu_plan(list(range(32)), topology)
        self.assertIsNone(warning)
        self.assertEqual(plan, {"replica0": [0, 1, 2, 3, 16, 17, 18, 19],
                                "replica1": [4, 5, 6, 7, 20, 21, 22, 23],
                                "haproxy": [8, 9, 10, 11, 24, 25, 26, 27],
                                "client": [12, 13, 14, 15, 28, 29, 30, 31]})

    def test_uneven_counts_go_to_the_first_sets(self):
        topology = fake_topology(self, [[c] for c in range(6)])
        plan, warning = proxy_bench.auto_cpu_plan(list(range(6)), topology)
        self.assertIsNone(warning)
        self.assertEqual([plan[r] for r in ROLES], [[0, 1], [2, 3], [4], [5]])

    def test_only_the_cpus_this_process_may_use(self):
        topology = fake_topology(self, [[c] for c in range(16)])
        plan, _ = proxy_bench.auto_cpu_plan([8, 9, 10, 11, 12, 13, 14, 15], topology)
        self.assertEqual([plan[r] for r in ROLES], [[8, 9], [10, 11], [12, 13], [14, 15]])

    def test_fewer_cores_than_sets_share_hyperthreads(self):
        topology = fake_topology(self, [[0, 2], [1, 3]])
        plan, warning = proxy_bench.auto_cpu_plan([0, 1, 2, 3], topology)
        self.assertEqual([plan[r] for r in ROLES], [[0], [1], [2], [3]])
        self.assertEqual(warning, "only 2 physical cores (CPUs 0-3) for 4 sets: they share cores, "
                                  "a hyperthread each")

    def test_fewer_cpus_than_sets_share_cpus(self):
        topology = fake_topology(self, [[0], [1]])
        plan, warning = proxy_bench.auto_cpu_plan([0, 1], topology)
        self.assertEqual([plan[r] for r in ROLES], [[0], [1], [0], [1]])
        self.assertEqual(warning, "only 2 CPUs (0-1) for 4 sets: they share CPUs, so HAProxy, "
                                  "the servers and the client still compete")
        plan, warning = proxy_bench.auto_cpu_plan([3], topology)
        self.assertEqual([plan[r] for r in ROLES], [[3], [3], [3], [3]])

    def test_haproxy_capped_at_its_thread_limit(self):
        topology = fake_topology(self, [[c] for c in range(400)])
        plan, _ = proxy_bench.auto_cpu_plan(list(range(400)), topology)
        self.assertEqual(plan["haproxy"], list(range(200, 264)))
        self.assertEqual(plan["client"], list(range(300, 400)))


class Args:
    """The attributes of parse_args' result that the HAProxy lines read."""

    def __init__(self, plan, busy_poll, online=(0, 1)):
        self.plan, self.busy_poll, self.online = plan, busy_poll, list(online)
        self.plan_warning = None


class HAProxyLinesTest(unittest.TestCase):
    def test_lines_and_flags_for_the_haproxy_set(self):
        plan = {"replica0": [0], "replica1": [1], "haproxy": [2, 3, 8], "client": [9]}
        self.assertEqual(proxy_bench.haproxy_global_lines(Args(plan, False)),
                         ["cpu-map auto:1/1-3 2-3 8"])
        self.assertEqual(proxy_bench.placement_flags(Args(plan, False)), ["--threads", "3"])
        self.assertEqual(proxy_bench.placement_flags(Args(plan, True)),
                         ["--threads", "3", "--busy-poll"])
        self.assertEqual(proxy_bench.haproxy_global_lines(Args({}, False)), [])
        self.assertEqual(proxy_bench.placement_flags(Args({}, False)), [])

    def test_busy_polling_needs_cpus_of_its_own(self):
        result = subprocess.run([sys.executable, proxy_bench.__file__, "--busy-poll"],
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("error: --busy-poll needs --cpus", result.stderr)

    def test_pinning_described(self):
        plan = {"replica0": [0, 1], "replica1": [2, 3], "haproxy": [4], "client": [5]}
        self.assertEqual(
            proxy_bench.pinning(Args(plan, True)),
            "pinned with taskset: gpucompute-0 on CPUs 0-1, gpucompute-1 on 2-3, HAProxy on 4 "
            "(nbthread 1; cpu-map auto:1/1-1 4), the bench client on 5; HAProxy busy-polling")
        self.assertEqual(proxy_bench.pinning(Args({}, False)),
                         "not pinned: every process may run on CPUs 0-1")

    def test_haproxy_accepts_the_lines(self):
        haproxy = cluster.find_haproxy()
        if haproxy is None:
            self.skipTest("haproxy is not installed (deploy/install-deps.sh installs it)")
        online = sorted(os.sched_getaffinity(0))
        work = tempfile.mkdtemp(prefix="proxy_bench_test.")
        self.addCleanup(shutil.rmtree, work)
        table = os.path.join(work, "placement")
        with open(table, "w") as f:
            f.write("tenant0 gpucompute-0\n")
        for cpus in (online[:1], online):
            with self.subTest(cpus=cpus):
                plan = {role: cpus for role in ROLES}
                # What placement.py writes for placement_flags(): nbthread and busy-polling.
                generated = placement.haproxy_config([("gpucompute-0", "127.0.0.1:1")], table,
                                                     "127.0.0.1:2", threads=len(cpus),
                                                     busy_poll=True)
                config = os.path.join(work, "haproxy.cfg")
                with open(config, "w") as f:
                    f.write(proxy_bench.with_section_lines(
                        generated, "global", proxy_bench.haproxy_global_lines(Args(plan, True))))
                result = subprocess.run([haproxy, "-c", "-f", config], capture_output=True, text=True)
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)


class PinnedTest(unittest.TestCase):
    def test_unpinned_argv_unchanged(self):
        self.assertEqual(cluster.pinned(["prog", "-x"], None), ["prog", "-x"])

    def test_pinned_process_runs_on_its_cpus_only(self):
        if shutil.which("taskset") is None:
            self.skipTest("taskset (util-linux) is not installed")
        cpu = min(os.sched_getaffinity(0))
        argv = cluster.pinned([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                              str(cpu))
        self.assertEqual(argv[1:3], ["-c", str(cpu)])
        self.assertEqual(subprocess.run(argv, capture_output=True, text=True, check=True).stdout,
                         f"[{cpu}]\n")


if __name__ == "__main__":
    unittest.main()
