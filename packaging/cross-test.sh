#!/bin/sh
# The unit tests for a foreign ARCH (default arm64): installs the cross dependencies, cross-builds
# the binary and the unit test programs into build-ARCH (what packaging/package.sh ARCH also
# uses) and runs ctest -L unit there; every test program runs under qemu-user.
set -eu
cd "$(dirname "$0")/.."
ARCH=${1:-arm64}
packaging/setup-cross.sh "$ARCH" >/dev/null
dir=build-$ARCH
# The configuration packaging/package.sh ARCH uses: -O2 like build/, no -g (stripped anyway).
cmake -S . -B "$dir" -G Ninja -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON -Wno-dev \
      -DCMAKE_TOOLCHAIN_FILE="$PWD/packaging/toolchain-$ARCH.cmake" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" >/dev/null
# Only the programs the unit label runs (tests/unit, and the packet builder's tests in tests/bpf),
# not the bpf/e2e programs. A new unit test program belongs in this list.
ninja -C "$dir" -j"${JOBS:-2}" mpsteer manifest_unit_tests chain_unit_tests bpf_packet_unit_tests
readelf -h "$dir/src/cli/mpsteer" | sed -n "s/^ *Machine: */cross: mpsteer built for /p"
ctest --test-dir "$dir" -L unit --output-on-failure --timeout 600
