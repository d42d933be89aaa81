#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Install test for a built package (default: build/packages/mpsteer_*_amd64.deb), in a clean
# Debian 12 root made by debootstrap (minbase) from Debian's mirror:
#   1. apt-get install ./mpsteer_*.deb pulls the dependencies dpkg-shlibdeps derived;
#   2. mpsteer validate /usr/share/mpsteer/policies passes, --help and the man page work;
#   3. every file is where it belongs, root-owned, 0755 (binary, directories) or 0644, the
#      conffile is registered;
#   4. the installed agent applies an operator's policy in a network namespace and leaves the
#      datapath attached when it stops and when the package is upgraded (reinstalled);
#   5. apt-get remove detaches it and keeps the operator's /etc/mpsteer/policies (and the
#      conffile, as dpkg does); apt-get purge --autoremove leaves exactly the operator's policies behind: the
#      whole file tree is compared with the one before the install.
# The debootstrap result is cached as a tarball in /var/cache/mpsteer-install-test, so only
# the first run downloads the base system. Needs root.
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "install-test: run as root (debootstrap, chroot)" >&2; exit 1; }
DEB=${1:-$(ls build/packages/mpsteer_*_amd64.deb 2>/dev/null | tail -n 1)}
[ -f "$DEB" ] || { echo "install-test: no package; build it with packaging/package.sh" >&2; exit 1; }
MIRROR=${MPS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=/var/cache/mpsteer-install-test
BASE=$CACHE/bookworm-minbase.tar.gz

for p in debootstrap; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$p"
done

if [ ! -f "$BASE" ]; then
    echo "install-test: debootstrap bookworm (minbase) from $MIRROR, cached in $BASE"
    mkdir -p "$CACHE"
    tmp=$(mktemp -d "$CACHE/root.XXXXXX")
    debootstrap --variant=minbase bookworm "$tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
        { tail -20 "$CACHE/debootstrap.log"; rm -rf "$tmp"; exit 1; }
    cat >"$tmp/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
    rm -rf "$tmp"/var/cache/apt/archives/*.deb
    tar -C "$tmp" -czf "$BASE.part" . && mv "$BASE.part" "$BASE"
    rm -rf "$tmp"
fi

ROOT=$(mktemp -d /tmp/mpsteer-install-root.XXXXXX)
NS=mps-install-$$
cleanup() {
    [ -z "${agent:-}" ] || kill "$agent" 2>/dev/null || true
    ip netns del "$NS" 2>/dev/null || true
    umount "$ROOT/sys/fs/bpf" 2>/dev/null || true
    umount "$ROOT/sys" 2>/dev/null || true
    umount "$ROOT/proc" 2>/dev/null || true
    rm -rf --one-file-system "$ROOT" "$ROOT".before "$ROOT".after "$ROOT".apt.log "$ROOT".agent.log
}
trap cleanup EXIT INT TERM
tar -C "$ROOT" -xzf "$BASE"
mount -t proc proc "$ROOT/proc"
# sysfs (libbpf reads the possible CPUs there) and a bpffs of the root's own, so the agent's
# pins are the root's (and outlive a network namespace's mount namespace).
mount -t sysfs -o ro sysfs "$ROOT/sys"
mount -t bpf -o mode=0700 bpf "$ROOT/sys/fs/bpf"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
in_root() { chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
fail=0
check() {  # desc=...; check COMMAND...: one line per check
    if "$@" >/dev/null 2>&1; then :; else echo "FAIL: $desc"; fail=1; return 0; fi
    echo "ok:   $desc"
}

in_root apt-get -o APT::Sandbox::User=root update -q >/dev/null  # no _apt user in the way
# The tree before, without what apt and dpkg keep about themselves.
snapshot() {
    (cd "$ROOT" && find . -xdev \( -path ./proc -o -path ./tmp -o -path ./var/lib/apt \
        -o -path ./var/lib/dpkg -o -path ./var/cache -o -path ./var/log \) -prune -o -print |
        sort)
}
snapshot >"$ROOT.before"
cp "$DEB" "$ROOT/tmp/"
pkg=$(basename "$DEB")
echo "install-test: apt-get install ./$pkg in a clean bookworm root"
if ! in_root sh -c "cd /tmp && apt-get install -y -q ./$pkg" >"$ROOT.apt.log" 2>&1; then
    cat "$ROOT.apt.log"; echo "FAIL: apt-get install"; exit 1
fi
grep -E "^(Setting up|Unpacking) " "$ROOT.apt.log" | sed 's/^/      /' | grep -i mpsteer || true

desc="mpsteer validate /usr/share/mpsteer/policies exits 0"
check in_root mpsteer validate /usr/share/mpsteer/policies
desc="mpsteer --help and every subcommand's --help (the test bed's through mpsteer-lab)"
check in_root sh -c 'mpsteer --help && for c in validate plan run status suspend resume reset events demo usecases bench; do mpsteer $c --help || exit 1; done && mpsteer bench --live --help | grep -q -- --prog-times'
desc="man page /usr/share/man/man8/mpsteer.8.gz is gzip'd roff naming the commands"
check in_root sh -c 'zcat /usr/share/man/man8/mpsteer.8.gz | grep -q "^.SH COMMANDS"'
for f in /usr/bin/mpsteer /usr/lib/mpsteer/mpsteer-lab /usr/share/mpsteer/bpf/mps_dp.bpf.o /usr/share/mpsteer/bpf/mps_ctl.bpf.o \
         /usr/share/mpsteer/schemas/policy.schema.json /usr/share/mpsteer/policies/lua/ecf.lua \
         /usr/share/mpsteer/policies/small-flow-pm.yaml /lib/systemd/system/mpsteer.service \
         /usr/lib/sysusers.d/mpsteer.conf \
         /etc/default/mpsteer; do
    desc="$f installed"
    check test -f "$ROOT$f"
done
desc="/etc/mpsteer/policies exists and is empty"
check sh -c "[ -d '$ROOT/etc/mpsteer/policies' ] && [ -z \"\$(ls -A '$ROOT/etc/mpsteer/policies')\" ]"
desc="the BPF objects are BPF ELF files"
check sh -c "od -An -tx1 -j18 -N2 '$ROOT/usr/share/mpsteer/bpf/mps_dp.bpf.o' | grep -q 'f7 00'"
desc="/etc/default/mpsteer is a conffile"
check in_root sh -c 'dpkg-query -W -f="\${Conffiles}" mpsteer | grep -q "/etc/default/mpsteer "'
# Owners and modes of everything the package installed.
bad=$(in_root sh -c 'dpkg -L mpsteer | while read -r f; do
        [ -e "$f" ] && [ ! -L "$f" ] || continue  # /lib is a usrmerge symlink
        stat -c "%U:%G %a %n" "$f"; done' |
      awk -v root="$ROOT" '$1 != "root:root" { print; next }
           $3 == "/usr/bin/mpsteer" || $3 == "/usr/lib/mpsteer/mpsteer-lab" { if ($2 != "755") print; next }
           { cmd = "test -d \"" root $3 "\""; isdir = (system(cmd) == 0) }
           isdir && $2 != "755" { print; next }
           !isdir && $2 != "644" { print }')
desc="owners root:root, modes 0755 (the two binaries, directories) and 0644 (the rest)${bad:+: $bad}"
check test -z "$bad"
desc="the unit runs the agent on /etc/mpsteer/policies with /etc/default/mpsteer"
check sh -c "grep -q '^ExecStart=/usr/bin/mpsteer run --policies \${MPSTEER_POLICIES} \$MPSTEER_OPTS' '$ROOT/lib/systemd/system/mpsteer.service' &&
             grep -q '^MPSTEER_POLICIES=/etc/mpsteer/policies' '$ROOT/etc/default/mpsteer'"

# The operator's policies: shipped ones, copied with the script the way an operator would (the
# small-flow policy runs at TC, the MP_JOIN guard at XDP).
mkdir -p "$ROOT/etc/mpsteer/policies/lua"
cp "$ROOT/usr/share/mpsteer/policies/small-flow-pm.yaml" \
    "$ROOT/usr/share/mpsteer/policies/mp-join-guard.yaml" "$ROOT/etc/mpsteer/policies/"
cp "$ROOT/usr/share/mpsteer/policies/lua/small_flow_pm.lua" "$ROOT/etc/mpsteer/policies/lua/"
desc="mpsteer validate /etc/mpsteer/policies (an operator's policy with its Lua script)"
check in_root mpsteer validate /etc/mpsteer/policies

# The installed agent on that policy, in a network namespace with one veth pair (it attaches
# to every interface but lo); stopping it leaves the datapath attached, removing the package
# detaches it (prerm: mpsteer reset).
ip netns add "$NS"
ip -n "$NS" link add mpsi0 type veth peer name mpsi1
for l in lo mpsi0 mpsi1; do ip -n "$NS" link set "$l" up; done
ip netns exec "$NS" chroot "$ROOT" env -i PATH=/usr/bin:/bin \
    mpsteer run --policies /etc/mpsteer/policies >"$ROOT.agent.log" 2>&1 &
agent=$!
for i in $(seq 60); do
    in_root mpsteer status >/dev/null 2>&1 && break
    sleep 0.5
done
desc="the installed agent applies /etc/mpsteer/policies (mpsteer status: ready)"
check in_root mpsteer status
desc="XDP attached to the namespace's veth, links pinned in the root's bpffs"
check sh -c "ip -n '$NS' link show mpsi0 | grep -q xdp && [ -n \"\$(ls -A '$ROOT/sys/fs/bpf/mpsteer/links')\" ]"
kill "$agent"; wait "$agent" 2>/dev/null || true; agent=""
desc="after the agent stopped, the datapath is still attached"
check sh -c "ip -n '$NS' link show mpsi0 | grep -q xdp"
[ "$fail" = 0 ] || sed 's/^/      agent: /' "$ROOT.agent.log" | tail -20
in_root sh -c "cd /tmp && apt-get install -y -q --reinstall ./$pkg" >"$ROOT.apt.log" 2>&1 ||
    { cat "$ROOT.apt.log"; fail=1; }
desc="an upgrade (reinstall: prerm upgrade, postinst configure) keeps the datapath attached"
check sh -c "ip -n '$NS' link show mpsi0 | grep -q xdp && [ -d '$ROOT/sys/fs/bpf/mpsteer/links' ]"

in_root apt-get remove -y -q mpsteer >"$ROOT.apt.log" 2>&1 || { cat "$ROOT.apt.log"; fail=1; }
desc="after remove: the datapath is detached and its pins are gone"
check sh -c "! ip -n '$NS' link show mpsi0 | grep -q xdp && [ ! -e '$ROOT/sys/fs/bpf/mpsteer' ]"
ip netns del "$NS"
desc="after remove: binary, data, unit gone; operator's policies and the conffile kept"
check sh -c "[ ! -e '$ROOT/usr/bin/mpsteer' ] && [ ! -e '$ROOT/usr/share/mpsteer' ] &&
             [ ! -e '$ROOT/lib/systemd/system/mpsteer.service' ] &&
             [ -f '$ROOT/etc/mpsteer/policies/small-flow-pm.yaml' ] &&
             [ -f '$ROOT/etc/mpsteer/policies/lua/small_flow_pm.lua' ] &&
             [ -f '$ROOT/etc/default/mpsteer' ]"
in_root apt-get purge -y -q --autoremove mpsteer >"$ROOT.apt.log" 2>&1 || { cat "$ROOT.apt.log"; fail=1; }
desc="after purge --autoremove: dpkg knows no mpsteer"
check sh -c "! chroot '$ROOT' dpkg-query -W -f='\${Status}' mpsteer"
snapshot >"$ROOT.after"
left=$(comm -13 "$ROOT.before" "$ROOT.after" | tr '\n' ' ')
gone=$(comm -23 "$ROOT.before" "$ROOT.after" | tr '\n' ' ')
want="./etc/mpsteer ./etc/mpsteer/policies ./etc/mpsteer/policies/lua ./etc/mpsteer/policies/lua/small_flow_pm.lua ./etc/mpsteer/policies/mp-join-guard.yaml ./etc/mpsteer/policies/small-flow-pm.yaml "
desc="after purge the tree is as before plus the operator's /etc/mpsteer/policies (left: $left${gone:+; missing: $gone})"
check test "$left" = "$want" -a -z "$gone"

if [ "$fail" = 0 ]; then echo "install-test: passed ($pkg)"; else echo "install-test: FAILED ($pkg)"; fi
exit "$fail"
