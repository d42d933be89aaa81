# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Shared part of packaging/toolchain-<arch>.cmake: those set MPS_CROSS_TRIPLET (GNU triplet),
# MPS_CROSS_DEB_ARCH (Debian architecture), CMAKE_SYSTEM_PROCESSOR and MPS_CROSS_QEMU.
#
# Libraries and headers come from Debian multiarch (/usr/lib/<triplet>, /usr/include), except
# libyaml-cpp-dev, which cannot be co-installed and is unpacked into /opt/mpsteer-cross/<arch>
# (packaging/setup-cross.sh); that prefix is searched first. Programs (clang for the BPF
# objects, bpftool for the skeletons) are the build machine's: the BPF objects use only UAPI
# headers and are the same for every architecture.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_C_COMPILER ${MPS_CROSS_TRIPLET}-gcc)
set(CMAKE_CXX_COMPILER ${MPS_CROSS_TRIPLET}-g++)
set(CMAKE_LIBRARY_ARCHITECTURE ${MPS_CROSS_TRIPLET})

set(CMAKE_FIND_ROOT_PATH /opt/mpsteer-cross/${MPS_CROSS_DEB_ARCH} /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config (libbpf, lua5.4) must see the target's .pc files only.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${MPS_CROSS_TRIPLET}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# Tests (ctest, catch_discover_tests) run the target's binaries under qemu-user with the
# multiarch loader and libraries (libc6:<arch>, installed by setup-cross.sh), one glibc build
# throughout. The cross toolchain's loader in /usr/<triplet> is an older glibc point release:
# paired with the multiarch libc it hangs the first pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR ${MPS_CROSS_QEMU} -L /)

# packaging/CPack.cmake: the package's architecture (CPack would ask dpkg for the build's).
set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE ${MPS_CROSS_DEB_ARCH})
