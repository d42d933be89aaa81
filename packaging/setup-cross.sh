#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Installs what cross-building mpsteer for ARCH (arm64 or armhf) needs: the cross compiler,
# qemu-user to run the tests, and the target's -dev packages; for arm64 with Debian multiarch,
# for armhf in a sysroot of its own (packaging/cross-sysroot.sh: the mirror's armhf security
# index has been seen mid-sync for days, and multiarch needs it at the host's versions).
# Idempotent: apt-get runs only when something is missing.
#
# libyaml-cpp-dev has no Multi-Arch field, so the arm64 one cannot be installed beside the
# amd64 one the native build uses. Its files (and the runtime library it links to) are unpacked
# with `dpkg -x` into /opt/mpsteer-cross/ARCH, which the toolchain file adds to the search root.
# The runtime package libyaml-cpp0.7 is Multi-Arch: same and is installed normally (qemu runs
# the tests against it, dpkg-shlibdeps maps it to a dependency).
set -eu
ARCH=${1:?usage: packaging/setup-cross.sh arm64|armhf}
case "$ARCH" in
    arm64) QEMU=qemu-user ;;
    armhf) ;;
    *) echo "setup-cross: unknown architecture $ARCH (arm64 or armhf)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
packaging/setup-deps.sh
if [ "$ARCH" = armhf ]; then
    # Only amd64 packages on the host (the gcc-12-arm-linux-gnueabihf cross compiler).
    packaging/apt-ensure.sh setup-cross crossbuild-essential-armhf qemu-user dpkg-dev \
        debian-archive-keyring
    exec packaging/cross-sysroot.sh armhf
fi

FOREIGN="libbpf-dev libelf-dev zlib1g-dev libssl-dev nettle-dev libspdlog-dev libfmt-dev liblua5.4-dev libseccomp-dev
libyaml-cpp0.7 libc6-dev libstdc++6 libgcc-s1"
PKGS="crossbuild-essential-$ARCH $QEMU dpkg-dev"
for p in $FOREIGN; do PKGS="$PKGS $p:$ARCH"; done

added=""
if ! dpkg --print-foreign-architectures | grep -qx "$ARCH"; then
    echo "setup-cross: adding the $ARCH architecture to dpkg"
    dpkg --add-architecture "$ARCH"
    added=1
fi
# shellcheck disable=SC2086
if ! packaging/apt-ensure.sh setup-cross $PKGS; then
    # An architecture whose packages cannot be installed (a mirror mid-sync) would keep failing
    # every apt-get update on this host, and can keep apt from other indexes of the same suite.
    if [ -n "$added" ]; then
        echo "setup-cross: removing the $ARCH architecture again"
        dpkg --remove-architecture "$ARCH" || true
    fi
    exit 1
fi

# libyaml-cpp-dev for ARCH, unpacked (same version as the runtime library installed above).
PREFIX=/opt/mpsteer-cross/$ARCH
ver=$(dpkg-query -W -f='${Version}' "libyaml-cpp0.7:$ARCH")
stamp="$PREFIX/.libyaml-cpp-dev-$ver"
if [ ! -e "$stamp" ]; then
    echo "setup-cross: unpacking libyaml-cpp-dev:$ARCH $ver into $PREFIX"
    tmp=$(mktemp -d); chmod 755 "$tmp"  # apt-get download runs as _apt
    (cd "$tmp" && apt-get download -q "libyaml-cpp-dev:$ARCH=$ver" "libyaml-cpp0.7:$ARCH=$ver")
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX"
    for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$PREFIX"; done
    rm -rf "$tmp"
    touch "$stamp"
fi
