#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The unit tests for a foreign ARCH (default arm64): installs the cross dependencies, cross-builds
# the binary and the unit test programs into build-ARCH (what packaging/package.sh ARCH also
# uses) and runs ctest -L unit there; every test program runs under qemu-user.
#   packaging/cross-test.sh [ARCH]                       build and run the unit label
#   packaging/cross-test.sh --build-only ARCH TARGET     only build TARGET there (the VM rig's
#                                                        vm_programs)
set -eu
cd "$(dirname "$0")/.."
build_only=""
[ "${1:-}" != --build-only ] || { build_only=1; shift; }
ARCH=${1:-arm64}
TARGET=${2:-unit_programs}
packaging/setup-cross.sh "$ARCH" >/dev/null
dir=build-$ARCH
# The configuration packaging/package.sh ARCH uses: -O2 like build/, no -g (stripped anyway).
cmake -S . -B "$dir" -G Ninja -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON -Wno-dev \
      -DCMAKE_TOOLCHAIN_FILE="$PWD/packaging/toolchain-$ARCH.cmake" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" >/dev/null
# Only the programs the unit label runs (tests/CMakeLists.txt: unit_programs), not the
# bpf/e2e ones.
ninja -C "$dir" -j"${JOBS:-2}" "$TARGET"
[ -z "$build_only" ] || exit 0
readelf -h "$dir/src/cli/mpsteer" | sed -n "s/^ *Machine: */cross: mpsteer built for /p"
# qemu-user (7.2) emulates netlink only for NETLINK_ROUTE, NETLINK_AUDIT and
# NETLINK_KOBJECT_UEVENT: a NETLINK_SOCK_DIAG socket fails with EPROTONOSUPPORT under it, so the
# unit test that reads TCP_INFO through sock_diag cannot run here (it runs natively).
echo "cross: not under qemu (no NETLINK_SOCK_DIAG in qemu-user): the sock_diag unit test"
# Validation's linear time is the same code on every architecture, and emulation's speed is not
# the board's: that test runs natively only (about a minute of CI under qemu).
echo "cross: not under qemu (emulation is no measure of speed): the linear-time validation test"
ctest --test-dir "$dir" -L unit -E "sock_diag|linear time" --output-on-failure --timeout 600
