# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Cross-building for arm64 (Raspberry Pi 3/4/5 with a 64-bit OS, arm64 servers) on Debian with
# multiarch. packaging/setup-cross.sh arm64 installs what it needs; packaging/package.sh arm64
# and packaging/cross-test.sh arm64 use it.
set(MPS_CROSS_TRIPLET aarch64-linux-gnu)
set(MPS_CROSS_DEB_ARCH arm64)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(MPS_CROSS_QEMU qemu-aarch64)
include(${CMAKE_CURRENT_LIST_DIR}/toolchain-common.cmake)
