# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Cross-building for armhf (32-bit Raspberry Pi OS, ARMv7 with hard float) on Debian with
# multiarch. packaging/setup-cross.sh armhf installs what it needs.
set(MPS_CROSS_TRIPLET arm-linux-gnueabihf)
set(MPS_CROSS_DEB_ARCH armhf)
set(CMAKE_SYSTEM_PROCESSOR armv7l)
set(MPS_CROSS_QEMU qemu-arm)
include(${CMAKE_CURRENT_LIST_DIR}/toolchain-common.cmake)
