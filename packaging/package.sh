#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Builds the Debian package for ARCH (default: this machine's, amd64 here) with CPack:
#   packaging/package.sh           -> build/packages/mpsteer_<version>_amd64.deb
#   packaging/package.sh arm64     -> build-arm64/packages/mpsteer_<version>_arm64.deb
#   packaging/package.sh armhf     -> build-armhf/packages/mpsteer_<version>_armhf.deb
# A foreign ARCH is cross-built (packaging/toolchain-ARCH.cmake) after packaging/setup-cross.sh
# installs its dependencies. Only the binary and the man page are built, not the tests.
set -eu
cd "$(dirname "$0")/.."
native=$(dpkg --print-architecture)
ARCH=${1:-$native}
if [ "$ARCH" = "$native" ]; then
    packaging/setup-deps.sh
    dir=build
    set -- -DCMAKE_BUILD_TYPE=RelWithDebInfo  # shares build/ with tests/run.sh
else
    packaging/setup-cross.sh "$ARCH"
    dir=build-$ARCH
    # The package is stripped: the same -O2 as build/, without -g (a third less compile time).
    set -- -DCMAKE_TOOLCHAIN_FILE="$PWD/packaging/toolchain-$ARCH.cmake" -DCMAKE_BUILD_TYPE=Release \
           -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG"
    # dpkg-shlibdeps: look the binary's libraries up for the target architecture, in the
    # sysroot's dpkg database when it has one (packaging/cross-sysroot.sh).
    export DEB_HOST_ARCH="$ARCH"
    db=/var/cache/mpsteer-cross/$ARCH/dpkg
    [ ! -d "$db" ] || export DPKG_ADMINDIR="$db"
fi
# The package needs only the two binaries and the man page: skip building everything else first.
cmake -S . -B "$dir" -G Ninja -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON -Wno-dev "$@" >/dev/null
ninja -C "$dir" -j"${JOBS:-2}" mpsteer mpsteer-lab mpsteer_docs
(cd "$dir" && cpack -G DEB >/dev/null)
deb=$(ls "$dir"/packages/mpsteer_*_"$ARCH".deb)
echo "package: $deb"
dpkg-deb --field "$deb" Package Version Architecture Depends
