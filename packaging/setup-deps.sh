#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Installs every Debian package the build, the tests and the lab need. Idempotent:
# runs apt-get only when something is missing. prometheus: promtool for the monitoring checks
# and the server the fleet test scrapes with (on a systemd host the package also enables its
# own prometheus.service on :9090; the tests never use that one). python3-matplotlib: the
# plots of `mpsteer usecases --plots`. clang-format: the tree's format check (tests/format_check.sh).
set -eu
PKGS="build-essential cmake ninja-build pkg-config git clang llvm libbpf-dev bpftool
libelf-dev zlib1g-dev libssl-dev nettle-dev libspdlog-dev libfmt-dev libcli11-dev catch2
liblua5.4-dev libseccomp-dev libyaml-cpp-dev libvalijson-dev nlohmann-json3-dev libclang-rt-14-dev
iproute2 ethtool iperf3 mptcpd tshark python3 python3-matplotlib jq prometheus clang-format"
# shellcheck disable=SC2086
"$(dirname "$0")/apt-ensure.sh" setup $PKGS
mountpoint -q /sys/fs/bpf || { echo "setup: mounting bpffs on /sys/fs/bpf"; mount -t bpf bpf /sys/fs/bpf; }
