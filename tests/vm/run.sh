#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The package on the kernels users run: boots a Debian kernel in qemu (software emulation, TCG;
# KVM only with MPS_VM_KVM=1) with the built .deb installed in a clean Debian 12 root, runs
# the checks inside the guest (tests/vm/guest.sh), prints their results and powers off.
#
#   tests/vm/run.sh ARCH KERNEL [CHECKS]
#     ARCH     amd64 | arm64 | armhf
#     KERNEL   6.1 (Debian 12's own: linux-image-amd64/-arm64/-armmp) | 6.12 (Debian 12's
#              linux-image-6.12-*) | host (no guest: the same checks in the root, chrooted, on
#              this machine's kernel; amd64 only)
#     CHECKS   comma-separated, default all: validate,bench,bpf,demo,churn (and always first
#              host: mpsteer validate --host, every program through the kernel's verifier);
#              also resilience (mpsteer usecases --only resilience, MPS_VM_ROUNDS rounds, 1)
#
# Exit status 0 when every check passed. Needs root. The package comes from packaging/package.sh
# ARCH; the bpf and churn checks need the test programs (ninja -C build vm_programs; cross:
# build-ARCH, built here when missing). The root (debootstrap, kernel, tools) is cached in
# /var/cache/mpsteer-vm per ARCH and kernel; the first run downloads it from Debian's mirror
# (MPS_DEBIAN_MIRROR), later runs only unpack it. MPS_VM_TIMEOUT (seconds, default 10800) bounds
# the guest's run, MPS_VM_CHECK_TIMEOUT (default 3600) each check (the bpf label under software
# emulation takes the better part of an hour); MPS_VM_VERBOSE=1 runs mpsteer -v (a refused program's whole verifier log);
# MPS_VM_NO_BTF=1 runs the datapath built for kernels without BTF (bpf/README.md) on a kernel that has it;
# MPS_VM_APPEND adds kernel arguments (e.g. sysctl.net.core.bpf_jit_enable=1).
# Each check's whole output lands in build/vm-logs/ARCH-KERNEL (-nobtf with MPS_VM_NO_BTF;
# MPS_VM_LOGS overrides).
set -eu
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "vm: run as root (debootstrap, chroot, loop-free ext4 image)" >&2; exit 1; }
usage() { sed -n 's/^# \{0,1\}//; 3,17p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
ARCH=$1 KERNEL=$2 CHECKS=${3:-validate,bench,bpf,demo,churn}
MIRROR=${MPS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=/var/cache/mpsteer-vm
TIMEOUT=${MPS_VM_TIMEOUT:-10800}
CHECK_TIMEOUT=${MPS_VM_CHECK_TIMEOUT:-3600}

case "$ARCH" in
amd64) flavour=amd64 qemu=qemu-system-x86_64 console=ttyS0 qemu_pkg=qemu-system-x86
       machine="-machine pc -cpu max" ;;
arm64) flavour=arm64 qemu=qemu-system-aarch64 console=ttyAMA0 qemu_pkg=qemu-system-arm
       machine="-machine virt -cpu max" ;;
armhf) flavour=armmp qemu=qemu-system-arm console=ttyAMA0 qemu_pkg=qemu-system-arm
       machine="-machine virt,highmem=off -cpu cortex-a15" ;;
*) usage ;;
esac
case "$KERNEL" in
6.1) kpkg=linux-image-$flavour ;;
6.12) kpkg=linux-image-6.12-$flavour ;;
host) [ "$ARCH" = amd64 ] || { echo "vm: 'host' runs the amd64 root on this machine's kernel" >&2; exit 2; }
      kpkg="" ;;
*) usage ;;
esac
native=$(dpkg --print-architecture)
[ "$ARCH" = "$native" ] && bdir=build || bdir=build-$ARCH

# ---- what the run needs on this machine --------------------------------------------------
packaging/apt-ensure.sh vm debootstrap e2fsprogs "$qemu_pkg" >/dev/null
if [ "$ARCH" != "$native" ]; then
    packaging/apt-ensure.sh vm qemu-user-static binfmt-support >/dev/null
    # Foreign roots run their maintainer scripts under qemu-user through binfmt_misc.
    mountpoint -q /proc/sys/fs/binfmt_misc ||
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    case "$ARCH" in arm64) fmt=qemu-aarch64 ;; armhf) fmt=qemu-arm ;; esac
    [ -e "/proc/sys/fs/binfmt_misc/$fmt" ] || update-binfmts --enable "$fmt"
fi

DEB=${MPS_VM_DEB:-$(ls "$bdir"/packages/mpsteer_*_"$ARCH".deb 2>/dev/null | tail -n 1)}
[ -f "$DEB" ] || { echo "vm: no package for $ARCH; build it with packaging/package.sh $ARCH" >&2; exit 1; }
# The test programs the guest runs for the bpf and churn checks, from the same build.
# MPS_VM_PROGRAMS narrows them (paths under the build directory).
programs=${MPS_VM_PROGRAMS:-"tests/bpf/bpf_datapath_tests tests/bpf/bpf_rewrite_tests
tests/bpf/bpf_rollout_tests tests/bpf/bpf_property_fuzz_tests tests/bpf/bpf_lb_tests
tests/e2e/e2e_agent_tests"}
case ",$CHECKS," in *,bpf,*|*,churn,*)
    missing=""
    for p in $programs; do [ -x "$bdir/$p" ] || missing="$missing $p"; done
    if [ -n "$missing" ]; then
        if [ "$bdir" = build ]; then
            ninja -C build vm_programs >/dev/null
        else
            JOBS=${JOBS:-2} packaging/cross-test.sh --build-only "$ARCH" vm_programs
        fi
    fi ;;
esac

# ---- the cached root: Debian 12 minbase, the kernel, what the checks use -------------------
tools="iproute2 procps ethtool kmod nftables initramfs-tools"
key=bookworm-$ARCH-${kpkg:-host}
BASE=$CACHE/$key.tar
if [ ! -f "$BASE" ]; then
    echo "vm: building the $key root (debootstrap, $kpkg), cached in $BASE"
    mkdir -p "$CACHE"
    tmp=$(mktemp -d "$CACHE/root.XXXXXX")
    trap 'rm -rf --one-file-system "$tmp" "$BASE.part" || true' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    log=$CACHE/$key.log
    foreign=""
    [ "$ARCH" = "$native" ] || foreign=--foreign
    if ! { debootstrap --variant=minbase --arch="$ARCH" $foreign bookworm "$tmp" "$MIRROR" &&
           { [ -z "$foreign" ] || chroot "$tmp" /debootstrap/debootstrap --second-stage; }; } \
           >"$log" 2>&1; then
        tail -20 "$log"; rm -rf --one-file-system "$tmp"; exit 1
    fi
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
        "$MIRROR" "$MIRROR" "${MIRROR%/debian}/debian-security" >"$tmp/etc/apt/sources.list"
    cp /etc/resolv.conf "$tmp/etc/resolv.conf"
    # Every module the initramfs may need to find the root disk (virtio, ext4).
    mkdir -p "$tmp/etc/initramfs-tools/conf.d"
    echo MODULES=most >"$tmp/etc/initramfs-tools/conf.d/mpsteer-vm"
    if ! chroot "$tmp" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
            sh -c "apt-get -o APT::Sandbox::User=root update -q ||
                   echo 'vm: some indexes failed (a mirror mid-sync): the lists that arrived'
                   apt-get -o APT::Sandbox::User=root install -y -q --no-install-recommends \
                       $tools $kpkg" >>"$log" 2>&1; then
        tail -20 "$log"; rm -rf --one-file-system "$tmp"; exit 1
    fi
    tar -C "$tmp" -cf "$BASE.part" . && mv "$BASE.part" "$BASE"
    rm -rf --one-file-system "$tmp"
    trap - EXIT
fi

# ---- this run's root: the cached one, the package, the test programs, the guest script -----
WORK=$(mktemp -d /var/tmp/mpsteer-vm.XXXXXX)
ROOT=$WORK/root
# Everything mounted beneath the root goes first, deepest first: in the host mode the lab's
# `ip netns add` bind-mounts the root's /run/netns, and checks cut short leave namespaces.
cleanup() {
    rc=$?
    awk -v r="$ROOT/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf --one-file-system "$WORK" 2>/dev/null || true
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir "$ROOT"
tar -C "$ROOT" -xf "$BASE"
pkg=$(basename "$DEB")
cp "$DEB" "$ROOT/tmp/"
echo "vm: $ARCH, kernel ${kpkg:-of this machine}, $pkg, checks $CHECKS"
if ! chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        sh -c "cd /tmp && apt-get -o APT::Sandbox::User=root install -y -q ./$pkg" \
        >"$WORK/apt.log" 2>&1; then
    cat "$WORK/apt.log"; echo "vm: FAILED: apt-get install ./$pkg"; exit 1
fi
rm -f "$ROOT/tmp/$pkg"
mkdir -p "$ROOT/opt/mpsteer-tests" "$ROOT/usr/local/sbin"
for p in $programs; do
    [ ! -x "$bdir/$p" ] || cp "$bdir/$p" "$ROOT/opt/mpsteer-tests/"
done
# The rollout tests read invalid manifests from the source tree, at its path here.
mkdir -p "$ROOT$PWD/tests/unit"
cp -r tests/unit/manifests "$ROOT$PWD/tests/unit/"
cp tests/vm/guest.sh "$ROOT/usr/local/sbin/mpsteer-vm-guest"
chmod 0755 "$ROOT/usr/local/sbin/mpsteer-vm-guest"

if [ "$KERNEL" = host ]; then
    mount -t proc proc "$ROOT/proc"
    mount -t sysfs sysfs "$ROOT/sys"
    mount -t bpf -o mode=0700 bpf "$ROOT/sys/fs/bpf"
    chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin MPS_VM_CHECKS="$CHECKS" \
        MPS_VM_VERBOSE="${MPS_VM_VERBOSE:-}" MPS_VM_CHECK_TIMEOUT="$CHECK_TIMEOUT" \
        MPS_VM_ROUNDS="${MPS_VM_ROUNDS:-1}" \
        ${MPS_VM_NO_BTF:+MPSTEER_DATAPATH_WITHOUT_BTF=1} \
        /usr/local/sbin/mpsteer-vm-guest --chroot 2>&1 | tee "$WORK/console.log"
else
    kernel=$(ls "$ROOT"/boot/vmlinuz-* | tail -n 1)
    initrd=$(ls "$ROOT"/boot/initrd.img-* | tail -n 1)
    cp "$kernel" "$WORK/vmlinuz"
    cp "$initrd" "$WORK/initrd"
    # An ext4 image filled from the directory (mke2fs -d): no loop device, no mount.
    size=$(( $(du -sm "$ROOT" | cut -f1) + 1536 ))
    mkfs.ext4 -q -F -L mpsteer-vm -d "$ROOT" "$WORK/root.img" "${size}M" >/dev/null
    # KVM only on request: where the CPU exposes no virtualisation to this machine (nested),
    # /dev/kvm may exist and the guest then hangs at boot.
    accel=tcg
    [ -z "${MPS_VM_KVM:-}" ] || [ "$ARCH" != "$native" ] || accel=kvm
    smp=2 mem=3072
    [ "$ARCH" != armhf ] || mem=2048
    echo "vm: booting $(basename "$kernel") under $qemu ($accel), $smp CPUs, $mem MiB"
    # shellcheck disable=SC2086
    timeout --foreground -k 10 "$TIMEOUT" "$qemu" $machine -accel "$accel" -smp "$smp" -m "$mem" \
        -nographic -no-reboot -nodefaults -serial stdio \
        -kernel "$WORK/vmlinuz" -initrd "$WORK/initrd" \
        -drive "file=$WORK/root.img,if=none,format=raw,id=root" \
        -device virtio-blk-pci,drive=root \
        -append "root=/dev/vda rw console=$console panic=-1 quiet loglevel=3 \
                 init=/usr/local/sbin/mpsteer-vm-guest mpsteer.checks=$CHECKS \
                 mpsteer.verbose=${MPS_VM_VERBOSE:-0} mpsteer.check_timeout=$CHECK_TIMEOUT \
                 mpsteer.no_btf=${MPS_VM_NO_BTF:-0} mpsteer.rounds=${MPS_VM_ROUNDS:-1} \
                 ${MPS_VM_APPEND:-}" \
        </dev/null 2>&1 | sed -u 's/\r$//' | tee "$WORK/console.log" |
        grep --line-buffered -E '^(mpsteer-vm|  )' || true
fi

# ---- the guest's logs, then the verdict -----------------------------------------------------
LOGS=${MPS_VM_LOGS:-$PWD/build/vm-logs/$ARCH-$KERNEL${MPS_VM_NO_BTF:+-nobtf}}
rm -rf "$LOGS"
mkdir -p "$LOGS"
cp "$WORK/console.log" "$LOGS/"
if [ "$KERNEL" = host ]; then
    cp "$ROOT"/var/log/mpsteer-vm/*.log "$LOGS/" 2>/dev/null || true
else
    debugfs -R "rdump /var/log/mpsteer-vm $LOGS" "$WORK/root.img" >/dev/null 2>&1 || true
    mv "$LOGS"/mpsteer-vm/* "$LOGS/" 2>/dev/null || true
    rmdir "$LOGS/mpsteer-vm" 2>/dev/null || true
fi
echo "vm: every check's whole output is in $LOGS"
if ! grep -q '^mpsteer-vm: checks done' "$WORK/console.log"; then
    echo "vm: FAILED: the guest did not finish its checks (console tail below)"
    tail -40 "$WORK/console.log"
    exit 1
fi
grep -E '^mpsteer-vm: (ok|FAILED|skipped) ' "$WORK/console.log" | sed 's/^mpsteer-vm: /vm: /'
if grep -q '^mpsteer-vm: FAILED ' "$WORK/console.log"; then
    echo "vm: FAILED on $ARCH $(grep -m1 '^mpsteer-vm: kernel ' "$WORK/console.log" | cut -d' ' -f3-)"
    exit 1
fi
echo "vm: passed on $ARCH $(grep -m1 '^mpsteer-vm: kernel ' "$WORK/console.log" | cut -d' ' -f3-)"
