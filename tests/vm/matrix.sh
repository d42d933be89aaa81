#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The support matrix: every cell through tests/vm/run.sh with every check, then one table.
#   tests/vm/matrix.sh [CELL...]     CELL = ARCH:KERNEL, default all of
#                                    amd64:6.1 amd64:6.12 amd64:host arm64:6.1 arm64:6.12 armhf:6.1
# Builds what a cell needs first (the package and the test programs; cross-built for arm64 and
# armhf). Takes hours under software emulation (arm64 and armhf most); each cell's output is in
# build/vm-logs/ARCH-KERNEL. Exit status 0 when every check of every cell passed.
set -eu
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "vm matrix: run as root" >&2; exit 1; }
cells=${*:-"amd64:6.1 amd64:6.12 amd64:host arm64:6.1 arm64:6.12 armhf:6.1"}
native=$(dpkg --print-architecture)
built=""
rc=0
results=$(mktemp)
trap 'rm -f "$results" "$results.cell"' EXIT
for cell in $cells; do
    arch=${cell%%:*} kernel=${cell#*:}
    case " $built " in
    *" $arch "*) ;;
    *)
        echo "vm matrix: building the $arch package and test programs"
        packaging/package.sh "$arch" >/dev/null
        if [ "$arch" = "$native" ]; then
            ninja -C build vm_programs >/dev/null
        else
            packaging/cross-test.sh --build-only "$arch" vm_programs >/dev/null
        fi
        built="$built $arch" ;;
    esac
    echo "vm matrix: $arch $kernel"
    rm -rf "build/vm-logs/$arch-$kernel"
    if tests/vm/run.sh "$arch" "$kernel" >"$results.cell" 2>&1; then :; else rc=1; fi
    sed 's/^/  /' "$results.cell" | grep -E '^  vm: (ok|FAILED|skipped|passed)' || tail -5 "$results.cell"
    release=$(sed -n 's/^mpsteer-vm: kernel \([^ ]*\).*/\1/p' "build/vm-logs/$arch-$kernel/console.log" 2>/dev/null | head -n 1)
    line="$arch	$kernel	${release:--}"
    for c in host validate bench bpf demo churn; do
        if grep -q "^vm: ok $c " "$results.cell"; then line="$line	ok"
        elif grep -q "^vm: FAILED $c " "$results.cell"; then line="$line	FAILED"
        else line="$line	-"; fi
    done
    compiled=$(sed -n 's/^mpsteer-vm: host: compiled: *//p' "build/vm-logs/$arch-$kernel/console.log" 2>/dev/null | head -n 1)
    echo "$line	${compiled:--}" >>"$results"
    rm -f "$results.cell"
done
echo
printf "%s\n" "arch	kernel	release	host	validate	bench	bpf	demo	churn	compiled entries" |
    cat - "$results"
exit "$rc"
