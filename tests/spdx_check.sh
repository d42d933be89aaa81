#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Every source file of the repository names its licence in its first lines (LICENSE):
#   tests/spdx_check.sh          lists the files without an SPDX-License-Identifier line, fails
#   tests/spdx_check.sh --fix    adds the line (after a #! line) in the file's comment syntax
# Not covered: documentation (*.md, its *.png figures), JSON (no comments; LICENSE and
# debian/copyright cover them), dpkg's conffiles list, the Debian changelog/copyright, test inputs whose line numbers
# tests assert (tests/unit/manifests/, tests/fuzz/corpus/).  (ctest: spdx_headers, label unit)
set -eu
cd "$(dirname "$0")/.."
SPDX="SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)"
fix=${1:-}
comment() {  # the line for file $1, or nothing when the file is not covered
    case "$1" in
        tests/unit/manifests/*|tests/fuzz/corpus/*|*.md|*.png|*.json|LICENSE|LICENSES/*|.gitignore) ;;
        packaging/debian/conffiles|packaging/debian/changelog|packaging/debian/copyright) ;;
        *.c|*.h|*.cpp|*.cpp.in) echo "// $SPDX" ;;
        *.lua) echo "-- $SPDX" ;;
        *.8) echo ".\\\" $SPDX" ;;
        *.sh|*.py|*.cmake|*/CMakeLists.txt|CMakeLists.txt|*.yaml|*.yml|*.dict|*.service|*.default|\
        */Containerfile|packaging/debian/*|.ci/*|*.clang-format) echo "# $SPDX" ;;
        *) echo "spdx: no comment syntax known for $1" >&2; echo "?" ;;
    esac
}
missing=0
for f in $(git ls-files); do
    line=$(comment "$f")
    [ -n "$line" ] || continue
    head -n 3 "$f" | grep -q "SPDX-License-Identifier:" && continue
    if [ "$line" = "?" ] || [ "$fix" != --fix ]; then
        echo "spdx: $f has no SPDX-License-Identifier in its first 3 lines"
        missing=$((missing + 1))
        continue
    fi
    if head -n 1 "$f" | grep -q '^#!'; then
        { head -n 1 "$f"; echo "$line"; tail -n +2 "$f"; } >"$f.spdx"
    else
        { echo "$line"; cat "$f"; } >"$f.spdx"
    fi
    chmod --reference="$f" "$f.spdx" && mv "$f.spdx" "$f"
    echo "spdx: added to $f"
done
[ "$missing" = 0 ] || { echo "spdx: $missing files without a licence line (tests/spdx_check.sh --fix)"; exit 1; }
echo "spdx: every source file names its licence"
