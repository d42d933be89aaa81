#!/bin/sh
# Installs every Debian package the build, the tests and the lab need. Idempotent:
# runs apt-get only when something is missing.
set -eu
PKGS="build-essential cmake ninja-build pkg-config git clang llvm libbpf-dev bpftool
libelf-dev zlib1g-dev libssl-dev libspdlog-dev libfmt-dev libcli11-dev catch2
liblua5.4-dev libyaml-cpp-dev libvalijson-dev nlohmann-json3-dev libclang-rt-14-dev
iproute2 ethtool iperf3 mptcpd tshark python3 jq"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing:$missing"
    export DEBIAN_FRONTEND=noninteractive
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    # With foreign architectures added for cross-building (packaging/setup-cross.sh), one index
    # caught mid-sync on the mirror fails the whole update; the install below still works with
    # the lists that did arrive.
    apt-get update -q || echo "setup: apt-get update reported errors; installing with the lists it got"
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $missing
fi
mountpoint -q /sys/fs/bpf || { echo "setup: mounting bpffs on /sys/fs/bpf"; mount -t bpf bpf /sys/fs/bpf; }
