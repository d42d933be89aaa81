#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The package under a real systemd: the install test's Debian root (plus systemd), booted with
# systemd-nspawn (its own network namespace with a veth, host0 inside; a bpffs of its own bound
# on /sys/fs/bpf; the capabilities the unit keeps and the bpf() system call, which nspawn's own
# filter denies its payload otherwise). With the hardened unit as shipped:
#   1. the unit starts and the agent gets Ready on an operator's policy;
#   2. systemctl reload re-reads the policy directory (SIGHUP);
#   3. systemctl stop ends it cleanly (exit 0) and the datapath stays attached;
#   4. systemctl start adopts the running datapath;
#   5. kill -9 of the agent: systemd restarts it, the datapath's pins, links and XDP program stay;
#   6. status.json is root's and the mpsteer group's only (0640).
# Needs root, the .deb (default: build/packages/mpsteer_*_amd64.deb) and the install test's
# cached Debian root (packaging/install-test.sh makes it). `systemd-analyze security` of the
# unit is printed for the record.
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "systemd-test: run as root" >&2; exit 1; }
DEB=${1:-$(ls build/packages/mpsteer_*_amd64.deb 2>/dev/null | tail -n 1)}
[ -f "$DEB" ] || { echo "systemd-test: no package; build it with packaging/package.sh" >&2; exit 1; }
CACHE=/var/cache/mpsteer-install-test
BASE=$CACHE/bookworm-minbase.tar.gz
[ -f "$BASE" ] || { echo "systemd-test: no $BASE; run packaging/install-test.sh first" >&2; exit 1; }
packaging/apt-ensure.sh systemd-test systemd-container

NAME=mpsst$$
ROOT=$(mktemp -d /tmp/mpsteer-systemd-root.XXXXXX)
BPFFS=$ROOT.bpffs
LOG=$ROOT.boot.log
nspawn=""
cleanup() {
    if [ -n "$nspawn" ] && kill -0 "$nspawn" 2>/dev/null; then
        kill -TERM "$nspawn" 2>/dev/null || true  # nspawn shuts the container's systemd down
        i=0
        while kill -0 "$nspawn" 2>/dev/null && [ $i -lt 30 ]; do sleep 1; i=$((i + 1)); done
        kill -KILL "$nspawn" 2>/dev/null || true
    fi
    umount "$BPFFS" 2>/dev/null || true
    for m in proc sys dev/pts dev; do umount "$ROOT/$m" 2>/dev/null || true; done
    rm -rf --one-file-system "$ROOT" "$BPFFS" "$LOG"
}
trap cleanup EXIT INT TERM

fails=0
check() {
    if "$@" >/dev/null 2>&1; then echo "ok: $desc"; else echo "FAIL: $desc"; fails=$((fails + 1)); fi
}
# Retries a check for up to $1 seconds.
eventually() {
    t=$1
    shift
    i=0
    until "$@" >/dev/null 2>&1; do
        i=$((i + 1))
        [ $i -lt "$t" ] || return 1
        sleep 1
    done
}

echo "systemd-test: the Debian root with systemd, and the package"
tar -C "$ROOT" -xzf "$BASE"
mount -t proc proc "$ROOT/proc"
mount --bind /dev "$ROOT/dev"
cp "$DEB" "$ROOT/tmp/mpsteer.deb"
chroot "$ROOT" sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get update -q &&
    apt-get install -y -q --no-install-recommends systemd systemd-sysv iproute2 /tmp/mpsteer.deb' \
    >"$ROOT.apt.log" 2>&1 || { tail -30 "$ROOT.apt.log"; rm -f "$ROOT.apt.log"; exit 1; }
rm -f "$ROOT.apt.log" "$ROOT/tmp/mpsteer.deb"
umount "$ROOT/dev" "$ROOT/proc"

# The operator's part: a policy on the container's interface, the unit enabled.
cat >"$ROOT/etc/mpsteer/policies/count.yaml" <<'EOF'
apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: count}
spec:
  attach: {hooks: [xdp, tc_egress]}
  priority: 100
  actions:
    - record: {metrics: [packets, bytes]}
EOF
sed -i 's/^MPSTEER_OPTS=.*/MPSTEER_OPTS="--metrics-port 9477 -i host0"/' "$ROOT/etc/default/mpsteer"
mkdir -p "$ROOT/etc/systemd/system/multi-user.target.wants"
ln -s /lib/systemd/system/mpsteer.service "$ROOT/etc/systemd/system/multi-user.target.wants/"
echo "$NAME" >"$ROOT/etc/hostname"

mkdir -p "$BPFFS"
mount -t bpf -o mode=0700 bpf "$BPFFS"
echo "systemd-test: booting $ROOT"
systemd-nspawn --boot --register=no --keep-unit --quiet -D "$ROOT" -M "$NAME" --network-veth \
    --capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN,CAP_NET_RAW,CAP_SYS_RESOURCE \
    --system-call-filter=bpf \
    --bind="$BPFFS:/sys/fs/bpf" >"$LOG" 2>&1 </dev/null &
nspawn=$!
# The container's init: nspawn's child (its own PID 1).
leader=""
i=0
while [ -z "$leader" ] && [ $i -lt 30 ]; do
    sleep 1
    leader=$(pgrep -P "$nspawn" | head -n 1 || true)
    i=$((i + 1))
done
[ -n "$leader" ] || { cat "$LOG"; echo "systemd-test: the container did not start" >&2; exit 1; }
in_ct() { nsenter -t "$leader" -a -- "$@"; }
in_ct timeout 120 systemctl is-system-running --wait >/dev/null 2>&1 || true
status_ok() { in_ct mpsteer status >/dev/null; }
prop() { in_ct systemctl show -p "$1" --value mpsteer.service; }
pins_linked() { [ -n "$(ls -A "$BPFFS/mpsteer/links" 2>/dev/null)" ]; }

desc="the hardened unit starts and the agent gets Ready (mpsteer status exits 0)"
check eventually 60 status_ok
if [ $fails -gt 0 ]; then
    in_ct systemctl status --no-pager mpsteer.service || true
    in_ct journalctl --no-pager -u mpsteer.service | tail -30 || true
fi
desc="its datapath is attached (links pinned under /sys/fs/bpf/mpsteer/links)"
check pins_linked
desc="status.json is 0640, group mpsteer"
check in_ct sh -c 'stat -c "%a %G" /run/mpsteer/status.json | grep -qx "640 mpsteer"'
desc="the hook process runs as mpsteer-hooks under its seccomp filter (mpsteer status)"
check in_ct sh -c 'mpsteer status | grep -q "^hook process: pid [0-9]*, user mpsteer-hooks, seccomp, 0 restarts"'
desc="the hook process has no capabilities, no_new_privs and seccomp mode 2 (/proc)"
check in_ct sh -c 'for p in /proc/[0-9]*; do
                       [ "$(tr "\0" " " <$p/cmdline 2>/dev/null)" = "mpsteer hook-host " ] || continue
                       grep -q "^CapEff:[[:space:]]*0000000000000000" $p/status &&
                       grep -q "^NoNewPrivs:[[:space:]]*1" $p/status &&
                       grep -q "^Seccomp:[[:space:]]*2" $p/status && exit 0
                   done; exit 1'

in_ct systemctl reload mpsteer.service
desc="systemctl reload re-reads the policy directory (SIGHUP)"
check eventually 15 in_ct sh -c 'journalctl --no-pager -u mpsteer.service | grep -q "SIGHUP: re-reading"'

in_ct systemctl stop mpsteer.service
desc="systemctl stop: a clean exit (status 0, result success)"
check sh -c "[ \"\$(nsenter -t $leader -a -- systemctl show -p ExecMainStatus --value mpsteer.service)\" = 0 ] &&
             [ \"\$(nsenter -t $leader -a -- systemctl show -p Result --value mpsteer.service)\" = success ]"
desc="the datapath stays attached while the agent is stopped"
check pins_linked

in_ct systemctl start mpsteer.service
desc="systemctl start: Ready again, adopting the running datapath"
check sh -c "$(command -v nsenter) -t $leader -a -- sh -c 'for i in \$(seq 60); do mpsteer status >/dev/null && exit 0; sleep 1; done; exit 1' &&
             nsenter -t $leader -a -- journalctl --no-pager -u mpsteer.service | grep -q 'adopted generation'"

restarts=$(prop NRestarts)
pid=$(prop MainPID)
xdp_prog() { in_ct ip -d link show host0 | sed -n 's/.*prog\/xdp id \([0-9]*\).*/\1/p' | head -n 1; }
prog=$(xdp_prog)
in_ct sh -c "kill -9 $pid"
desc="the datapath's links stay pinned right after kill -9"
check pins_linked
desc="kill -9: systemd restarts the agent (a new main PID, NRestarts + 1) and it gets Ready"
check eventually 30 sh -c "[ \"\$(nsenter -t $leader -a -- systemctl show -p NRestarts --value mpsteer.service)\" -gt $restarts ] &&
                           [ \"\$(nsenter -t $leader -a -- systemctl show -p MainPID --value mpsteer.service)\" != $pid ] &&
                           nsenter -t $leader -a -- mpsteer status"
desc="the datapath ran on throughout: the same XDP program (${prog:-none}) before kill -9 and after the restart"
check test -n "$prog" -a "$(xdp_prog)" = "$prog"

echo "systemd-test: systemd-analyze security of the shipped unit:"
systemd-analyze security --offline=yes "$ROOT/lib/systemd/system/mpsteer.service" 2>/dev/null |
    tail -n 1 || true

[ $fails -eq 0 ] || { echo "systemd-test: $fails check(s) failed"; exit 1; }
echo "systemd-test: all checks passed"
