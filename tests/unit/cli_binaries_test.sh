#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The node's binary and the test bed's: mpsteer links none of the lab, hands demo, usecases and
# bench --live to mpsteer-lab with the same arguments, and says so when mpsteer-lab is missing.
# usage: cli_binaries_test.sh MPSTEER_BINARY (mpsteer-lab beside it)
set -u
MPS=$1
fail=0
no() { echo "FAIL $*"; fail=1; }
nm -C "$MPS" | grep -q 'mpsteer::lab::' && no "mpsteer links the lab (mpsteer::lab:: symbols)"
"$MPS" demo --help | grep -q -- '--plot' || no "mpsteer demo --help: not the demo's options"
"$MPS" -v usecases --help | grep -q -- '--only' || no "mpsteer -v usecases --help: not the use cases' options"
"$MPS" bench --live --help | grep -q -- '--prog-times' || no "mpsteer bench --live --help: not the live options"
"$MPS" bench --help | grep -q -- '--prog-times' && no "mpsteer bench --help shows the live bench's options"
"$MPS" bench --help | grep -q -- '--repeat' || no "mpsteer bench --help: not the BPF_PROG_TEST_RUN options"
"$MPS" demo --no-such-option >/dev/null 2>&1; [ $? -eq 2 ] || no "mpsteer demo with a bad option: want exit 2"
tmp=$(mktemp -d /tmp/mpsteer-cli-binaries.XXXXXX)
cp "$MPS" "$tmp/mpsteer"
out=$("$tmp/mpsteer" demo --help 2>&1); rc=$?
rm -rf "$tmp"
[ $rc -eq 1 ] && printf '%s\n' "$out" | grep -q 'mpsteer-lab' ||
    no "without mpsteer-lab: want exit 1 naming it (exit $rc: $out)"
[ $fail -eq 0 ] && echo "ok: mpsteer without the lab, demo/usecases/bench --live through mpsteer-lab"
exit $fail
