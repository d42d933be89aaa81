#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The validate command end to end: every invalid manifest exits 1 and prints exactly its
# expected error lines; the valid examples and the valid-YAML corpus exit 0; usage errors exit 2.
# usage: cli_validate_test.sh MPSTEER_BINARY MANIFESTS_DIR
set -u
MPS=$1
DIR=$2
fail=0
cd "$DIR/invalid" || exit 1
for f in *.yaml; do
    out=$("$MPS" validate "$f" 2>/dev/null)
    rc=$?
    got=$(printf '%s\n' "$out" | grep ': error: ')
    want=$(sed -n 's/^# expect: //p' "$f")
    if [ "$rc" -ne 1 ] || [ "$got" != "$want" ]; then
        echo "FAIL $f (exit $rc)"; echo "  want: $want"; echo "  got:  $got"; fail=1
    fi
done
cd "$DIR" || exit 1
"$MPS" validate valid >/dev/null 2>&1 || { echo "FAIL valid examples"; fail=1; }
"$MPS" validate valid-yaml >/dev/null 2>&1 || { echo "FAIL valid-YAML corpus"; fail=1; }
"$MPS" validate >/dev/null 2>&1; [ $? -eq 2 ] || { echo "FAIL no path: want exit 2"; fail=1; }
"$MPS" validate --output yaml valid >/dev/null 2>&1; [ $? -eq 2 ] || { echo "FAIL bad --output: want exit 2"; fail=1; }
"$MPS" validate does-not-exist >/dev/null 2>&1; [ $? -eq 2 ] || { echo "FAIL missing path: want exit 2"; fail=1; }
"$MPS" validate --output json invalid/32-cidr-host-bits.yaml | grep -q '"valid": false' ||
    { echo "FAIL json output"; fail=1; }
[ $fail -eq 0 ] && echo "ok: $(ls invalid/*.yaml | wc -l) invalid manifests, valid examples, usage errors"
exit $fail
