#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# A sysroot of Debian 12 ARCH -dev packages for cross-building without multiarch (used by
# packaging/setup-cross.sh for armhf): multiarch needs the foreign Multi-Arch: same packages at
# exactly the host's versions, so a mirror whose foreign security index lags blocks it, while a
# sysroot only has to be consistent with itself.
#
#   /var/cache/mpsteer-cross/ARCH/root   the packages, unpacked (dpkg -x), symlinks made relative
#   /var/cache/mpsteer-cross/ARCH/dpkg   a dpkg database of them, paths inside root/: what
#                                        dpkg-shlibdeps reads (DPKG_ADMINDIR) for the .deb's Depends
#   /var/cache/mpsteer-cross/ARCH/apt    apt's private state, lists and downloads
#
# Resolved and downloaded by apt-get with a private configuration (own sources, empty dpkg
# status, APT::Architecture=ARCH); the host's apt setup is not touched. Built once and kept:
# rebuilt when the package list below changes or with MPSTEER_SYSROOT_REFRESH=1.
# Usage: packaging/cross-sysroot.sh ARCH
set -eu
ARCH=${1:?usage: packaging/cross-sysroot.sh ARCH}
MIRROR=${MPSTEER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${MPSTEER_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# What the build links and includes (the unit tests too), with their dependencies (the
# runtime libraries, libc6-dev). The header-only Architecture: all ones are here so that CMake
# searches the sysroot only; they come without their dependencies (libvalijson-dev's would
# add Qt, Poco and MariaDB for adapters mpsteer does not use).
PKGS="libbpf-dev libelf-dev zlib1g-dev libssl-dev nettle-dev libspdlog-dev libfmt-dev liblua5.4-dev libseccomp-dev
libyaml-cpp-dev libc6-dev libstdc++-12-dev catch2"
NODEPS="libcli11-dev nlohmann-json3-dev libvalijson-dev"

top=/var/cache/mpsteer-cross/$ARCH
root=$top/root
stamp=$root/.mpsteer-sysroot
want=$(echo "$ARCH $PKGS $NODEPS" | tr -s ' \n' '  ')
if [ -e "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -z "${MPSTEER_SYSROOT_REFRESH:-}" ]; then
    exit 0
fi
fail() { echo "cross-sysroot: $*" >&2; exit 1; }
[ -r "$KEYRING" ] || fail "no $KEYRING (install debian-archive-keyring)"

echo "cross-sysroot: building the $ARCH sysroot in $root"
state=$top/apt
mkdir -p "$state/lists/partial" "$state/archives/partial" "$state/etc"
: > "$state/status"
src="[arch=$ARCH signed-by=$KEYRING]"
# shellcheck disable=SC2086
aptp() {
    apt-get -q -o Dir::State="$state" -o Dir::State::status="$state/status" \
        -o Dir::Cache="$state" -o Dir::Cache::pkgcache="" -o Dir::Cache::srcpkgcache="" \
        -o Dir::Etc::SourceList="$state/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null \
        -o APT::Architecture="$ARCH" -o APT::Architectures="$ARCH" \
        -o APT::Install-Recommends=false "$@"
}
# Security updates when the mirror serves a consistent index for ARCH; without them the
# sysroot is bookworm + bookworm-updates (its versions need not match the host's).
printf 'deb %s %s %s main\n' "$src" "$MIRROR" bookworm "$src" "$MIRROR" bookworm-updates \
    "$src" "$SECURITY" bookworm-security > "$state/etc/sources.list"
if ! aptp update > "$state/update.log" 2>&1; then
    echo "cross-sysroot: could not fetch every $ARCH index; without bookworm-security:" >&2
    grep '^E:' "$state/update.log" | head -n 2 >&2 || true
    printf 'deb %s %s %s main\n' "$src" "$MIRROR" bookworm "$src" "$MIRROR" bookworm-updates \
        > "$state/etc/sources.list"
    aptp update > "$state/update.log" 2>&1 || {
        cat "$state/update.log" >&2; fail "apt-get update for the $ARCH sysroot failed"; }
fi
rm -f "$state"/archives/*.deb
# shellcheck disable=SC2086
aptp install -y --download-only $PKGS > "$state/install.log" 2>&1 || {
    cat "$state/install.log" >&2; fail "apt-get could not resolve or download: $PKGS"; }
# shellcheck disable=SC2086
(cd "$state/archives" && aptp download $NODEPS) >> "$state/install.log" 2>&1 || {
    cat "$state/install.log" >&2; fail "apt-get could not download: $NODEPS"; }

# Unpack into a new tree, then swap it in: an interrupted run leaves no half sysroot.
rm -rf "$root.new" "$top/dpkg.new"
mkdir -p "$root.new" "$top/dpkg.new/info" "$top/dpkg.new/updates"
: > "$top/dpkg.new/status"
ctl=$(mktemp -d)
trap 'rm -rf "$ctl"' EXIT
for deb in "$state"/archives/*.deb; do
    dpkg -x "$deb" "$root.new"
    # The database entry: dpkg names Multi-Arch: same packages' files pkg:ARCH.*
    pkg=$(dpkg-deb -f "$deb" Package)
    [ "$(dpkg-deb -f "$deb" Multi-Arch)" = same ] && name=$pkg:$ARCH || name=$pkg
    { dpkg-deb -f "$deb" | sed '/^Package:/a Status: install ok installed'; echo; } \
        >> "$top/dpkg.new/status"
    dpkg-deb -c "$deb" | awk -v r="$root" '{ p = substr($6, 2); sub("/$", "", p); print r p }' \
        > "$top/dpkg.new/info/$name.list"
    rm -rf "$ctl"/*
    dpkg-deb -e "$deb" "$ctl/c"
    for f in shlibs symbols; do
        [ ! -e "$ctl/c/$f" ] || cp "$ctl/c/$f" "$top/dpkg.new/info/$name.$f"
    done
done
echo "$ARCH" > "$top/dpkg.new/arch"
echo 1 > "$top/dpkg.new/info/format"  # info files named pkg:ARCH.* (Multi-Arch: same)
# Absolute symlinks (libfoo.so -> /lib/...) would point at the build machine's files.
find "$root.new" -type l | while read -r link; do
    target=$(readlink "$link")
    case "$target" in /*) ln -sfr "$root.new$target" "$link" ;; esac
done
rm -rf "$root" "$top/dpkg"
mv "$root.new" "$root"
mv "$top/dpkg.new" "$top/dpkg"
echo "$want" > "$stamp"
echo "cross-sysroot: $(ls "$state"/archives/*.deb | wc -l) packages in $root"
rm -f "$state"/archives/*.deb  # unpacked: the sysroot is what is kept
