#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# A deliberate layout change must fail to compile: src/datapath/abi_check.cpp builds as is,
# and stops at its static assertions when MPS_ABI_LAYOUT_PROBE adds a field to mps_conn
# (bpf/include/mpsteer/abi.h). Usage: abi_layout_probe.sh CXX INCLUDE_DIR ABI_CHECK_CPP
set -u
cxx=$1 include=$2 src=$3
compile() { "$cxx" -std=c++20 -fsyntax-only -I"$include" "$@" "$src" 2>&1; }

if ! out=$(compile); then
    echo "abi_check.cpp does not compile as it is:"; echo "$out"; exit 1
fi
if out=$(compile -DMPS_ABI_LAYOUT_PROBE); then
    echo "abi_check.cpp compiled although mps_conn changed layout"; exit 1
fi
echo "$out"
if ! echo "$out" | grep -Eq "static.assert.*mps_conn"; then
    echo "the compiler failed, but not on a static assertion about mps_conn"; exit 1
fi
echo "ok: the changed layout fails at a static assertion"
