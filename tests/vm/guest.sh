#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Runs inside the test guest as its init (tests/vm/run.sh), or in the chrooted root with
# --chroot: sets up the few mounts the checks need, runs the checks named on the kernel command
# line (mpsteer.checks=...) or in MPS_VM_CHECKS, prints one line per check, powers off.
# Lines meant for the host start with "mpsteer-vm: "; a failed check's output tail follows it,
# indented.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C
TESTS=/opt/mpsteer-tests
# The checks that are more than one command, run by check() as "$0 --run NAME".
if [ "${1:-}" = --run ]; then
    case "$2" in
    # One load of the datapath per program and table size, shared by its cases
    # (tests/bpf/bpf_env.h): a load takes minutes under emulation.
    bpf) rc=0
         for p in "$TESTS"/bpf_*_tests; do
             echo "== $p"
             MPS_BPF_ONE_LOAD=1 "$p" || rc=1
         done
         exit "$rc" ;;
    churn) MPSTEER_BIN=/usr/bin/mpsteer MPSTEER_AGENT_REVISIONS=${MPS_VM_REVISIONS:-20} \
               exec "$TESTS/e2e_agent_tests" "agent: 200 revisions*" ;;
    esac
    exit 2
fi
chroot_mode=""
[ "${1:-}" != --chroot ] || chroot_mode=1
say() { echo "mpsteer-vm: $*"; }

if [ -z "$chroot_mode" ]; then
    mount -t proc proc /proc
    mount -t sysfs sysfs /sys
    mount -t devtmpfs devtmpfs /dev 2>/dev/null || true
    mkdir -p /dev/pts /dev/shm
    mount -t devpts devpts /dev/pts
    mount -t tmpfs tmpfs /dev/shm
    mount -t tmpfs tmpfs /run
    # /tmp stays the image's own directory: the rig puts the source tree's test files at the
    # checkout's path, which may be under /tmp (a tmpfs there would hide them).
    mount -t bpf bpf /sys/fs/bpf
    mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null || true
    mount -o remount,rw /
    hostname mpsteer-vm
    ip link set lo up
    for arg in $(cat /proc/cmdline); do
        case "$arg" in
        mpsteer.checks=*) MPS_VM_CHECKS=${arg#mpsteer.checks=} ;;
        mpsteer.verbose=1) MPS_VM_VERBOSE=1 ;;
        mpsteer.no_btf=1) export MPSTEER_DATAPATH_WITHOUT_BTF=1 ;;
        mpsteer.check_timeout=*) MPS_VM_CHECK_TIMEOUT=${arg#mpsteer.check_timeout=} ;;
        mpsteer.rounds=*) MPS_VM_ROUNDS=${arg#mpsteer.rounds=} ;;
        esac
    done
fi
exec 2>&1
say "kernel $(uname -r) $(uname -m), $(nproc) CPUs"

# mpsteer -v: debug logging, with the verifier's whole log of a refused program.
V=""
[ -z "${MPS_VM_VERBOSE:-}" ] || V=-v
LOGS=/var/log/mpsteer-vm
mkdir -p "$LOGS"
check() {  # check NAME COMMAND...: one line, the output tail when it fails
    name=$1
    shift
    t0=$(date +%s)
    if timeout -k 10 "${MPS_VM_CHECK_TIMEOUT:-3600}" "$@" >"$LOGS/$name.log" 2>&1; then
        say "ok $name ($(( $(date +%s) - t0 )) s)$(summary "$name")"
    else
        rc=$?
        how="exit $rc"
        [ "$rc" != 124 ] && [ "$rc" != 137 ] || how="timed out"
        say "FAILED $name ($how after $(( $(date +%s) - t0 )) s)"
        tail -n 40 "$LOGS/$name.log" | sed 's/^/  /'
    fi
}
summary() {  # a figure worth seeing on the check's line
    case "$1" in
    bpf) echo ": $(grep -c '^All tests passed' "$LOGS/bpf.log") of $(grep -c '^== ' "$LOGS/bpf.log") test programs passed" ;;
    bench) if grep -q '^compiled_entries_refused' "$LOGS/bench.log"; then
               echo ": compiled entries refused, $(sed -n 's/^compiled_entries_refused: //p' "$LOGS/bench.log")"
           else echo ": chain4_match_ratio $(sed -n 's/^chain4_match_ratio: //p' "$LOGS/bench.log") (under emulation not a speed figure)"; fi ;;
    esac
}
have_tests() { [ -x "$TESTS/$1" ]; }

# Always first: what the kernel offers the datapath, every program through its verifier (the
# check fails when one is refused), shown whole.
check host mpsteer $V validate --host /usr/share/mpsteer/policies
grep -v '^\[' "$LOGS/host.log" | sed 's/^/mpsteer-vm: host: /'
for c in $(echo "${MPS_VM_CHECKS:-validate,bench,bpf,demo,churn}" | tr , ' '); do
    case "$c" in
    validate) check validate mpsteer $V validate /usr/share/mpsteer/policies ;;
    bench) check bench mpsteer $V bench --rounds 1 ;;
    bpf) if ls "$TESTS"/bpf_*_tests >/dev/null 2>&1; then check bpf "$0" --run bpf
         else say "skipped bpf (no test programs in the root)"; fi ;;
    # The agent's first apply runs every program through the verifier: minutes on 6.1 under
    # emulation, so the demo may wait for it as long as a check may take.
    demo) check demo mpsteer $V demo --ready-timeout "${MPS_VM_CHECK_TIMEOUT:-3600}" ;;
    churn) if have_tests e2e_agent_tests; then check churn "$0" --run churn
           else say "skipped churn (no test programs in the root)"; fi ;;
    # Not in the default set: the use case, the kernel alone and with the shipped policy, on
    # this kernel (emulated: its timings are the emulator's too).
    resilience) check resilience mpsteer $V usecases --only resilience \
                    --rounds "${MPS_VM_ROUNDS:-1}" ;;
    *) say "FAILED $c (no such check)" ;;
    esac
done
say "checks done"
if [ -z "$chroot_mode" ]; then
    sync
    echo o >/proc/sysrq-trigger
    sleep 30
fi
