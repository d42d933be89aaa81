# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Cross-building for armhf (32-bit Raspberry Pi OS, ARMv7 with hard float) on Debian against a
# sysroot of Debian 12 armhf packages (no multiarch). packaging/setup-cross.sh armhf installs
# what it needs; packaging/package.sh armhf and packaging/cross-test.sh armhf use it.
set(MPS_CROSS_TRIPLET arm-linux-gnueabihf)
set(MPS_CROSS_DEB_ARCH armhf)
set(CMAKE_SYSTEM_PROCESSOR armv7l)
set(MPS_CROSS_QEMU qemu-arm)
set(MPS_CROSS_SYSROOT /var/cache/mpsteer-cross/armhf/root)  # packaging/cross-sysroot.sh
include(${CMAKE_CURRENT_LIST_DIR}/toolchain-common.cmake)
# 64-bit off_t and ino_t (large file support; Debian's armhf gets it by default from trixie
# on): with 32-bit ones readdir and stat fail with EOVERFLOW on large inode numbers and 64-bit
# directory offsets, which ext4 hands to qemu-arm (it runs on a 64-bit kernel). No library
# mpsteer links has off_t in its interface.
set(CMAKE_C_FLAGS_INIT -D_FILE_OFFSET_BITS=64)
set(CMAKE_CXX_FLAGS_INIT -D_FILE_OFFSET_BITS=64)
