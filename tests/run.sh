#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The whole test suite: build, then every ctest label (unit, bpf, e2e, cross, package). Needs root
# for the bpf, e2e and package labels; cross installs the arm64 cross tools (Debian multiarch)
# and runs the unit tests cross-built for arm64 under qemu. Extra arguments go to ctest (for
# example: -L unit).
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "tests: run as root (BPF and network namespaces)" >&2; exit 1; }
packaging/build.sh
# Serial: e2e tests measure throughput and would disturb each other on a small machine.
ctest --test-dir build --output-on-failure --timeout 600 "$@"
