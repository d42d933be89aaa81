#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The DaemonSet's image, built and run on this machine with Debian's podman, without a registry:
#   1. the base image is the install test's Debian 12 root (packaging/install-test.sh caches it),
#      `podman import`ed; the image is packaging/kubernetes/Containerfile with the built .deb;
#   2. the container runs the agent as daemonset.yaml does: the same command and arguments,
#      capabilities (all dropped but BPF, PERFMON, NET_ADMIN, NET_RAW, SYS_RESOURCE, SETUID,
#      SETGID), read-only
#      root, no new privileges, no seccomp profile (podman's default allows bpf() only with
#      CAP_SYS_ADMIN), and the same mounts (bpffs on
#      /sys/fs/bpf with HostToContainer propagation, /run/mpsteer, the git-sync volume read-only
#      on /git, the textfile directory). The node is a network namespace (hostNetwork: its
#      interfaces), its bpffs a directory of this host's, the git-sync sidecar this script
#      (a worktree per commit, the `current` symlink flipped);
#   3. Ready (the readiness probe, `mpsteer status`, exits 0), XDP attached to the node's veth;
#      a new commit is applied; `podman restart` keeps the datapath attached, and the new
#      container adopts it: same generation, same XDP program, no apply;
#   4. the liveness probe (`mpsteer status --alive`) fails on a frozen (SIGSTOPped) agent and
#      passes again once it runs.
# Usage: packaging/kubernetes/container-test.sh [DEB]   (ctest: package_container_image)
set -eu
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "container-test: run as root (podman, netns)" >&2; exit 1; }
DEB=${1:-$(ls build/packages/mpsteer_*_amd64.deb 2>/dev/null | tail -n 1)}
[ -f "$DEB" ] || { echo "container-test: no package; packaging/package.sh" >&2; exit 1; }
BASE_TAR=/var/cache/mpsteer-install-test/bookworm-minbase.tar.gz
[ -f "$BASE_TAR" ] || { echo "container-test: no $BASE_TAR; run packaging/install-test.sh" >&2; exit 1; }
# runc, not crun (podman's default): crun refuses hosts with cgroups in hybrid mode.
packaging/apt-ensure.sh container-test podman runc

BASE=localhost/mpsteer-base:bookworm
IMAGE=localhost/mpsteer:test
CT=mpsteer-ct-$$
NS=mps-ct-$$
NODE_BPF=/sys/fs/bpf/mps-ct-$$   # the node's bpffs as the container sees it
TMP=$(mktemp -d /tmp/mpsteer-container.XXXXXX)
cleanup() {
    podman --runtime runc rm -f -t 0 "$CT" >/dev/null 2>&1 || true
    podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
    build/src/cli/mpsteer reset --pin-root "$NODE_BPF/mpsteer" --state-dir "$TMP/run" \
        >/dev/null 2>&1 || true
    rm -rf "$NODE_BPF"
    ip netns del "$NS" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
fail=0
check() {  # desc=...; check COMMAND...: one line per check
    if "$@" >/dev/null 2>&1; then echo "ok:   $desc"; else echo "FAIL: $desc"; fail=1; fi
}

# 1. The base (re-imported when the cached root is newer) and the image.
if ! podman image exists "$BASE" ||
   [ "$(stat -c %Y "$BASE_TAR")" -gt "$(date -d "$(podman image inspect -f '{{.Created}}' "$BASE" |
        cut -d' ' -f1,2)" +%s)" ]; then
    podman import -q "$BASE_TAR" "$BASE" >/dev/null
fi
mkdir -p "$TMP/context"
cp "$DEB" "$TMP/context/mpsteer.deb"
t0=$(date +%s)
# RUN steps isolated by chroot: no OCI runtime, so no cgroup or rlimit setup (see below).
podman build -q --isolation chroot --network host -f packaging/kubernetes/Containerfile --build-arg BASE="$BASE" \
    --build-arg DEB=mpsteer.deb -t "$IMAGE" "$TMP/context" >"$TMP/build.log" 2>&1 ||
    { cat "$TMP/build.log"; echo "FAIL: podman build"; exit 1; }
echo "ok:   podman build from $BASE ($(( $(date +%s) - t0 )) s, $(podman image inspect -f '{{.Size}}' "$IMAGE" |
    awk '{printf "%d MB", $1 / 1e6}'))"

# 2. A policy repository and its publication as git-sync does it.
git init -q "$TMP/repo"
# The small-flow policy runs at TC, the MP_JOIN guard at XDP (the program watched below).
cp policies/small-flow-pm.yaml policies/mp-join-guard.yaml "$TMP/repo/" && mkdir "$TMP/repo/lua" &&
    cp lua/small_flow_pm.lua "$TMP/repo/lua/"
commit() { git -C "$TMP/repo" add -A && git -C "$TMP/repo" -c user.name=t -c user.email=t@t.invalid \
    commit -q -m "$1" && git -C "$TMP/repo" rev-parse HEAD; }
publish() {  # a worktree for the commit, then the link flipped to it in one rename
    mkdir -p "$TMP/git/.worktrees/$1"
    git -C "$TMP/repo" archive "$1" | tar -x -C "$TMP/git/.worktrees/$1"
    ln -sfn ".worktrees/$1" "$TMP/git/current.new" && mv -T "$TMP/git/current.new" "$TMP/git/current"
}
c1=$(commit "small-flow-pm")
publish "$c1"
mkdir -p "$TMP/run" "$TMP/textfile" "$NODE_BPF"
ip netns add "$NS"
ip -n "$NS" link add mpsc0 type veth peer name mpsc1
for l in lo mpsc0 mpsc1; do ip -n "$NS" link set "$l" up; done

# The container spec of daemonset.yaml, in podman's words.
# Resource limits: the runtime's own, as a kubelet's container gets them (podman would raise
# RLIMIT_NOFILE/NPROC for root, which fails where the host's hard limits are lower).
podman --runtime runc run -d -q --name "$CT" --network "ns:/run/netns/$NS" --user 0 \
    --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096 \
    --cap-drop all --cap-add BPF,PERFMON,NET_ADMIN,NET_RAW,SYS_RESOURCE,SETUID,SETGID \
    --read-only --security-opt no-new-privileges --security-opt seccomp=unconfined \
    -v "$NODE_BPF:/sys/fs/bpf:rslave" -v "$TMP/run:/run/mpsteer" -v "$TMP/git:/git:ro" \
    -v "$TMP/textfile:/var/lib/prometheus/node-exporter" \
    --entrypoint /usr/bin/mpsteer "$IMAGE" run --policies=/git/current --metrics-port=9477 \
    --metrics-textfile=/var/lib/prometheus/node-exporter/mpsteer.prom >/dev/null
ready() { podman exec "$CT" /usr/bin/mpsteer status >/dev/null 2>&1; }  # the readiness probe
status() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$TMP/run/status.json" "$1"; }
wait_for() {  # wait_for COMMAND...: up to 30 s
    for _ in $(seq 150); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1
}
applied() { [ "$(status applied_revision 2>/dev/null)" = "$1" ] && ready; }
xdp_prog() { ip -n "$NS" -d link show mpsc0 | sed -n 's/.*prog\/xdp id \([0-9]*\).*/\1/p' | head -n 1; }

desc="Ready in the container (readiness probe: mpsteer status exits 0), commit ${c1%"${c1#???????}"} applied"
check wait_for applied "$c1"
desc="XDP attached to the node's interface, links pinned in the node's bpffs"
check sh -c "[ -n \"\$(ip -n '$NS' -d link show mpsc0 | grep 'prog/xdp')\" ] && [ -n \"\$(ls -A '$NODE_BPF/mpsteer/links')\" ]"
desc="the hook process runs unprivileged under its seccomp filter (mpsteer status)"
check sh -c "podman exec '$CT' /usr/bin/mpsteer status | grep -Eq '^hook process: pid [0-9]+, user (mpsteer-hooks|nobody), seccomp, 0 restarts'"

cp policies/ecf-scheduler.yaml "$TMP/repo/" && cp lua/ecf.lua "$TMP/repo/lua/"
c2=$(commit "ecf-scheduler")
publish "$c2"
desc="a new commit published (link flipped): applied, Ready"
check wait_for applied "$c2"
desc="the node_exporter textfile reports it: mpsteer_revision_info{applied=\"$(echo "$c2" | cut -c1-7)…\"}"
check grep -q "^mpsteer_revision_info{applied=\"$c2\"" "$TMP/textfile/mpsteer.prom"

gen=$(status generation); prog=$(xdp_prog)
podman stop -t 30 "$CT" >/dev/null
desc="container stopped: the datapath stays attached (XDP program $prog)"
check test "$(xdp_prog)" = "$prog"
podman start "$CT" >/dev/null
desc="container restarted: Ready on $(echo "$c2" | cut -c1-7)"
check wait_for applied "$c2"
adopted() {  # the new agent's own report: same generation and program, no apply of its own
    [ "$(status generation)" = "$gen" ] && [ "$(xdp_prog)" = "$prog" ] &&
        grep -qx 'mpsteer_applies_total{result="success"} 0' "$TMP/textfile/mpsteer.prom"
}
desc="datapath adopted: generation $gen and XDP program $prog kept, no apply by the new agent"
check wait_for adopted

# The liveness probe on a frozen agent: stopped (SIGSTOP from the node), it stops writing its
# status and `mpsteer status --alive` fails after 10 s; continued, it is alive again.
alive() { podman exec "$CT" /usr/bin/mpsteer status --alive; }
desc="liveness probe (mpsteer status --alive) passes on the running agent"
check alive
agent_pid=$(podman inspect -f '{{.State.Pid}}' "$CT")
kill -STOP "$agent_pid"
desc="liveness probe fails on the frozen agent (status older than 10 s)"
frozen() {
    sleep 12
    ! out=$(alive) && case $out in "not alive: the agent last wrote its status"*) ;; *) false ;; esac
}
check frozen
kill -CONT "$agent_pid"
desc="liveness probe passes again once it runs"
check wait_for alive
[ "$fail" = 0 ] || podman logs "$CT" 2>&1 | tail -20 | sed 's/^/      agent: /'

podman stop -t 30 "$CT" >/dev/null
if [ "$fail" = 0 ]; then echo "container-test: passed"; else echo "container-test: FAILED"; fi
exit "$fail"
