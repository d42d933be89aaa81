#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Fuzzes the manifest loader, validator and compiler with libFuzzer (Debian's clang, with
# AddressSanitizer and UndefinedBehaviorSanitizer) for SECONDS (default 600).
#   tests/fuzz/run.sh [seconds]
# Builds in build-fuzz/ next to the sources; the corpus grows in build-fuzz/corpus (seeded
# from tests/fuzz/corpus, the shipped policies and the test manifests). Crashes are saved as
# build-fuzz/crash-*; exits non-zero on any crash or sanitizer report.
set -eu
SECONDS_TO_RUN=${1:-600}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT="$SRC/build-fuzz"
CLANG=${CLANG:-clang}
CLANGXX=${CLANGXX:-clang++}
command -v "$CLANGXX" >/dev/null || { echo "run.sh: $CLANGXX not found (apt-get install clang)"; exit 2; }

# yaml-cpp comes from Debian (not instrumented); everything of ours is.
cmake -S "$SRC" -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="$CLANG" -DCMAKE_CXX_COMPILER="$CLANGXX" \
    -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
    -DMPS_FUZZ=ON >/dev/null
ninja -C "$OUT" fuzz_manifest

mkdir -p "$OUT/corpus"
cp "$SRC"/tests/fuzz/corpus/* "$OUT/corpus/" 2>/dev/null || true
find "$SRC/policies" "$SRC/tests/unit/manifests" -name '*.yaml' | while read -r f; do
    cp "$f" "$OUT/corpus/seed-$(echo "$f" | md5sum | cut -c1-12).yaml"
done

cd "$OUT"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
./tests/fuzz/fuzz_manifest -max_total_time="$SECONDS_TO_RUN" -max_len=8192 -timeout=10 \
    -rss_limit_mb=2048 -dict="$SRC/tests/fuzz/manifest.dict" -print_final_stats=1 corpus
