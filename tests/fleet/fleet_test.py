#!/usr/bin/env python3
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# A fleet on one machine: N agents, each in its own network namespace with its own pin root and
# state directory, each following one git repository through its own git-sync (a clone, a
# worktree per commit, the `current` symlink flipped; polled every --sync-period), scraped by a
# real Prometheus server (Debian's). Every verdict comes from PromQL:
#   1. rollouts: every node applies each new commit; time from the push to each node's first
#      scrape showing it (p50, p99, full convergence);
#   2. an invalid commit is applied nowhere: every node attempted it, reports errors and keeps
#      its last good commit;
#   3. a node that was down while a commit landed catches up when it comes back.
# Usage (root): tests/fleet/fleet_test.py MPSTEER [--nodes 8] [--rollouts 5]
#   (ctest: fleet_prometheus, label e2e)
import argparse, ctypes, json, os, random, select, shutil, signal, socket, subprocess, sys
import tempfile, threading, time, urllib.parse, urllib.request

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLONE_NEWNET = 0x40000000
libc = ctypes.CDLL(None, use_errno=True)


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Forwarder(threading.Thread):
    """127.0.0.1:port on the host -> 127.0.0.1:9477 in a namespace (the agent's metrics bind
    to the namespace's loopback). The thread enters the namespace; the listener stays the
    host's."""

    def __init__(self, netns):
        super().__init__(daemon=True)
        self.netns = netns
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

    def run(self):
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        os.close(fd)
        while True:
            client, _ = self.listener.accept()
            try:
                upstream = socket.create_connection(("127.0.0.1", 9477), timeout=2)
            except OSError:
                client.close()  # the agent is down: Prometheus records up == 0
                continue
            self.relay(client, upstream)

    @staticmethod
    def relay(a, b):
        peers = {a: b, b: a}
        try:
            while peers:
                ready, _, _ = select.select(list(peers), [], [], 5)
                if not ready:
                    break
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            pass
        finally:
            a.close()
            b.close()


class GitSync(threading.Thread):
    """What the git-sync sidecar does on one node: poll the branch, check each new commit out
    into its own worktree, flip the `current` link to it in one rename, drop the old one."""

    def __init__(self, origin, root, period):
        super().__init__(daemon=True)
        self.origin, self.root, self.period = origin, root, period
        self.clone = os.path.join(root, ".git-clone")
        sh("git", "clone", "-q", "--no-checkout", origin, self.clone)
        self.head = None
        self.stop = threading.Event()
        self.sync()

    def sync(self):
        sh("git", "-C", self.clone, "fetch", "-q", "origin", "main")
        head = sh("git", "-C", self.clone, "rev-parse", "FETCH_HEAD")
        if head == self.head:
            return
        wt = os.path.join(self.root, ".worktrees", head)
        sh("git", "-C", self.clone, "worktree", "add", "-q", "--detach", wt, head)
        tmp = os.path.join(self.root, "current.new")
        os.symlink(os.path.join(".worktrees", head), tmp)
        os.rename(tmp, os.path.join(self.root, "current"))
        if self.head:
            sh("git", "-C", self.clone, "worktree", "remove", "--force",
               os.path.join(self.root, ".worktrees", self.head))
        self.head = head

    def run(self):
        time.sleep(random.uniform(0, self.period))  # the sidecars are not in phase
        while not self.stop.wait(self.period):
            self.sync()


class Prometheus:
    def __init__(self, work, targets, interval):
        self.url = f"http://127.0.0.1:{free_port()}"
        cfg = {"global": {"scrape_interval": interval, "scrape_timeout": interval},
               "scrape_configs": [{"job_name": "mpsteer", "static_configs": [
                   {"targets": [t], "labels": {"instance": name}} for name, t in targets]}]}
        path = os.path.join(work, "prometheus.yml")
        with open(path, "w") as f:
            json.dump(cfg, f)  # JSON is YAML
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={work}/tsdb",
             f"--web.listen-address={self.url[7:]}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"))
        wait(lambda: self.get("/-/ready"), 30, "Prometheus ready")

    def get(self, path):
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return r.read().decode()
        except OSError:
            return None

    def query(self, q, at=None):
        params = {"query": q}
        if at is not None:
            params["time"] = f"{at:.3f}"
        text = self.get("/api/v1/query?" + urllib.parse.urlencode(params))
        if text is None:
            raise AssertionError(f"PromQL query failed: {q}")
        body = json.loads(text)
        return {r["metric"].get("instance", ""): float(r["value"][1])
                for r in body["data"]["result"]}

    def scalar(self, q, at=None):
        r = self.query(q, at)
        return next(iter(r.values())) if r else None

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def wait(pred, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s: {what}")


class Node:
    def __init__(self, i, args, work, origin, tag):
        self.name = f"node-{i}"
        self.netns = f"mps-fleet-{tag}-{i}"
        self.pins = f"/sys/fs/bpf/mps-fleet-{tag}-{i}"
        self.dir = os.path.join(work, self.name)
        self.mpsteer = args.mpsteer
        os.makedirs(os.path.join(self.dir, "git"))
        sh("ip", "netns", "add", self.netns)
        sh("ip", "-n", self.netns, "link", "add", "mpsf0", "type", "veth", "peer", "name", "mpsf1")
        for link in ("lo", "mpsf0", "mpsf1"):
            sh("ip", "-n", self.netns, "link", "set", link, "up")
        self.sync = GitSync(origin, os.path.join(self.dir, "git"), args.sync_period)
        self.forwarder = Forwarder(self.netns)
        self.forwarder.start()
        self.agent = None

    def start(self):
        self.agent = subprocess.Popen(
            [self.mpsteer, "run", "--policies", os.path.join(self.dir, "git", "current"),
             "--netns", self.netns, "--pin-root", self.pins,
             "--state-dir", os.path.join(self.dir, "run"), "--metrics-port", "9477"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "agent.log"), "a"))

    def stop(self):
        if self.agent:
            self.agent.send_signal(signal.SIGTERM)
            self.agent.wait(30)
            self.agent = None

    def cleanup(self):
        self.sync.stop.set()
        try:
            self.stop()
        except Exception:
            self.agent.kill()
        subprocess.run([self.mpsteer, "reset", "--pin-root", self.pins,
                        "--state-dir", os.path.join(self.dir, "run")], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


def commit(repo, message, files):
    for path, text in files.items():
        full = os.path.join(repo, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if text is None:
            os.remove(full)
        else:
            with open(full, "w") as f:
                f.write(text)
    sh("git", "-C", repo, "add", "-A")
    sh("git", "-C", repo, "-c", "user.name=fleet", "-c", "user.email=fleet@mpsteer.invalid",
       "commit", "-q", "-m", message)
    sh("git", "-C", repo, "push", "-q", "origin", "HEAD:main")
    return sh("git", "-C", repo, "rev-parse", "HEAD"), time.time()


BROKEN = """apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: broken}
spec:
  attach: {hooks: [xdp]}
  priority: high
  actions: [{mark: {}}]
"""


def read(path):
    with open(os.path.join(REPO_ROOT, path)) as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mpsteer")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rollouts", type=int, default=5)
    ap.add_argument("--sync-period", type=float, default=1.0, help="git-sync's poll period (s)")
    ap.add_argument("--scrape-interval", default="250ms")
    args = ap.parse_args()
    args.mpsteer = os.path.abspath(args.mpsteer)
    tag = str(os.getpid())
    work = tempfile.mkdtemp(prefix="mpsteer-fleet.")
    nodes, prom = [], None
    try:
        # The policy repository: a bare "remote" and the operator's working copy.
        origin, repo = os.path.join(work, "origin.git"), os.path.join(work, "repo")
        sh("git", "init", "-q", "--bare", "-b", "main", origin)
        sh("git", "clone", "-q", origin, repo)
        small = read("policies/small-flow-pm.yaml")
        c, _ = commit(repo, "small-flow-pm", {"small-flow-pm.yaml": small,
                                              "lua/small_flow_pm.lua": read("lua/small_flow_pm.lua")})
        nodes = [Node(i, args, work, origin, tag) for i in range(1, args.nodes + 1)]
        for n in nodes:
            n.start()
            n.sync.start()
        prom = Prometheus(work, [(n.name, f"127.0.0.1:{n.forwarder.port}") for n in nodes],
                          args.scrape_interval)
        N = len(nodes)
        on = lambda commit: f'count(mpsteer_revision_info{{applied="{commit}"}})'
        wait(lambda: prom.scalar(on(c)) == N and prom.scalar("sum(mpsteer_ready)") == N, 120,
             f"all {N} nodes Ready on the first commit")
        print(f"fleet: {N} agents Ready on {c[:7]}, scraped every {args.scrape_interval}")

        # 1. Rollouts: each commit changes the priority of the first small-flow policy.
        print(f"fleet: {args.rollouts} rollouts (git-sync period {args.sync_period} s)")
        figures = []
        for r in range(args.rollouts):
            c, pushed = commit(repo, f"rollout {r}",
                               {"small-flow-pm.yaml": small.replace("priority: 90", f"priority: {91 + r}", 1)})
            wait(lambda: prom.scalar(on(c)) == N, 60, f"all nodes on rollout {r}")
            time.sleep(1)  # the last scrape is in
            first_seen = (f'min_over_time(timestamp(mpsteer_revision_info{{applied="{c}"}})'
                          f'[2m:{args.scrape_interval}]) - {pushed:.3f}')
            q = {k: prom.scalar(f"{agg}({first_seen}))") for k, agg in
                 (("p50", "quantile(0.5,"), ("p99", "quantile(0.99,"), ("full", "max("))}
            figures.append(q)
            print(f"  rollout {r} ({c[:7]}): p50 {q['p50']:.2f} s, p99 {q['p99']:.2f} s, "
                  f"all {N} nodes {q['full']:.2f} s")
        good = c

        # 2. An invalid commit: a policy whose priority is not a number.
        bad, _ = commit(repo, "invalid", {"broken.yaml": BROKEN})
        wait(lambda: prom.scalar(f'count(mpsteer_revision_info{{attempted="{bad}"}})') == N, 60,
             "every node attempted the invalid commit")
        time.sleep(1)
        assert prom.scalar(on(bad)) is None, "the invalid commit is applied somewhere"
        assert prom.scalar(on(good)) == N, "a node lost its last good commit"
        assert prom.scalar("count(mpsteer_errors > 0)") == N, "a node reports no errors"
        assert prom.scalar("sum(mpsteer_ready)") == 0, "a node is Ready on the invalid commit"
        print(f"fleet: invalid commit {bad[:7]}: attempted by {N}, applied by 0, "
              f"{N} nodes keep {good[:7]} with errors > 0")

        # 3. A node down while the fix lands catches up when it comes back.
        down = nodes[-1]
        down.stop()
        wait(lambda: prom.query(f'up{{instance="{down.name}"}} == 0'), 30, "up == 0 for the node")
        # The fix also changes a policy, so the returning node has a real apply to make.
        fix, _ = commit(repo, "fix", {"broken.yaml": None, "small-flow-pm.yaml":
                                      small.replace("priority: 90", "priority: 99", 1)})
        wait(lambda: prom.scalar(on(fix)) == N - 1, 60, "the running nodes on the fix")
        assert prom.query(f'mpsteer_revision_info{{instance="{down.name}",applied="{fix}"}}') == {}
        restarted = time.time()
        down.start()
        wait(lambda: prom.scalar(on(fix)) == N and prom.scalar("sum(mpsteer_ready)") == N, 60,
             "the restarted node caught up")
        time.sleep(1)
        caught = prom.scalar(f'min_over_time(timestamp(mpsteer_revision_info{{instance="{down.name}",'
                             f'applied="{fix}"}})[2m:{args.scrape_interval}]) - {restarted:.3f}')
        print(f"fleet: {down.name} was down (up == 0) while {fix[:7]} landed; back on it "
              f"{caught:.2f} s after its restart; all {N} nodes Ready on {fix[:7]}")

        p50 = sorted(f["p50"] for f in figures)[len(figures) // 2]
        p99 = max(f["p99"] for f in figures)
        full = max(f["full"] for f in figures)
        print(f"fleet: passed: {N} nodes, {args.rollouts} rollouts: median p50 {p50:.2f} s, "
              f"worst p99 {p99:.2f} s, worst full convergence {full:.2f} s")
        return 0
    except AssertionError as e:
        print(f"fleet: FAILED: {e}")
        for n in nodes:
            print(f"  {n.name} agent log (tail):")
            try:
                with open(os.path.join(n.dir, "agent.log")) as f:
                    for line in f.readlines()[-3:]:
                        print("    " + line.rstrip())
            except OSError:
                pass
        return 1
    finally:
        if prom:
            prom.close()
        for n in nodes:
            n.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
