#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The test suite: build, then the ctest labels unit, bpf, e2e, package and vm (Debian 12's own
# kernel in a guest). Needs root for the bpf, e2e, package and vm labels.
#   tests/run.sh           the default run (what CI runs; 35-40 minutes on a fresh 2-core machine)
#   tests/run.sh --all     also the cross label: the arm64 and armhf builds, their unit tests
#                          under qemu-user and their packages through lintian (~25 minutes more)
#   tests/run.sh ARGS...   ctest with ARGS instead, for example: tests/run.sh -L unit
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "tests: run as root (BPF and network namespaces)" >&2; exit 1; }
case "${1:-}" in
"") set -- -LE cross ;;
--all) shift ;;
-h | --help) sed -n '3,8s/^# \{0,1\}//p' "$0"; exit 0 ;;
esac
packaging/build.sh
# Serial: e2e tests measure throughput and would disturb each other on a small machine.
ctest --test-dir build --output-on-failure --timeout 600 "$@"
