#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Every C and C++ file is as clang-format leaves it (.clang-format: src/ and tests/;
# bpf/.clang-format: kernel style). Fails listing the files that are not, with the command
# that formats them. Debian 12's clang-format (14): another version formats a few constructs
# differently, so this is the one the tree follows. (ctest: clang_format, label unit)
set -eu
cd "$(dirname "$0")/.."
FORMAT=${CLANG_FORMAT:-clang-format}
command -v "$FORMAT" >/dev/null ||
    { echo "format: no $FORMAT; packaging/setup-deps.sh installs Debian's clang-format" >&2; exit 1; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files=$(git ls-files 'src/*.cpp' 'src/*.h' 'tests/*.cpp' 'tests/*.h' 'bpf/*.c' 'bpf/*.h' 'src/*.c' 'tests/*.c')
else
    files=$(find src tests bpf -name '*.cpp' -o -name '*.h' -o -name '*.c' | sort)
fi
bad=""
for f in $files; do
    "$FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1 || bad="$bad $f"
done
if [ -n "$bad" ]; then
    echo "format: not as $FORMAT ($("$FORMAT" --version | sed 's/.*version //')) leaves them:"
    for f in $bad; do echo "  $f"; done
    echo "format: $FORMAT -i$bad"
    exit 1
fi
echo "format: $(echo "$files" | wc -w) files as $FORMAT leaves them"
