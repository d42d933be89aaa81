#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Lintian on a built package: fails on any error, lists the warnings (each justified in
# docs/install-and-kernels.md, "Package tests"). Usage: packaging/lintian.sh [ARCH] (default
# amd64: what package.sh ARCH wrote, build/ or build-ARCH/packages/mpsteer_*_ARCH.deb).
set -eu
cd "$(dirname "$0")/.."
ARCH=${1:-$(dpkg --print-architecture)}
packaging/apt-ensure.sh lintian lintian
if [ "$ARCH" = "$(dpkg --print-architecture)" ]; then dir=build; else dir=build-$ARCH; fi
deb=$(ls "$dir"/packages/mpsteer_*_"$ARCH".deb 2>/dev/null | tail -n 1)
[ -f "$deb" ] || { echo "lintian: no package; build it with packaging/package.sh $ARCH" >&2; exit 1; }
# --fail-on error: warnings and informational tags are reported, not fatal.
out=$(lintian --fail-on error --tag-display-limit 0 "$deb") && rc=0 || rc=$?
[ -z "$out" ] || echo "$out"
echo "lintian: $(echo "$out" | grep -c '^E:') errors, $(echo "$out" | grep -c '^W:') warnings ($deb)"
exit "$rc"
