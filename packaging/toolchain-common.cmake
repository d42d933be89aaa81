# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Shared part of packaging/toolchain-<arch>.cmake: those set MPS_CROSS_TRIPLET (GNU triplet),
# MPS_CROSS_DEB_ARCH (Debian architecture), CMAKE_SYSTEM_PROCESSOR and MPS_CROSS_QEMU, and
# MPS_CROSS_SYSROOT when the target's packages are in a sysroot (packaging/cross-sysroot.sh).
#
# Without a sysroot, libraries and headers come from Debian multiarch (/usr/lib/<triplet>,
# /usr/include), except libyaml-cpp-dev, which cannot be co-installed and is unpacked into
# /opt/mpsteer-cross/<arch> (packaging/setup-cross.sh); that prefix is searched first. Programs (clang for the BPF
# objects, bpftool for the skeletons) are the build machine's: the BPF objects use only UAPI
# headers and are the same for every architecture.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_C_COMPILER ${MPS_CROSS_TRIPLET}-gcc)
set(CMAKE_CXX_COMPILER ${MPS_CROSS_TRIPLET}-g++)
set(CMAKE_LIBRARY_ARCHITECTURE ${MPS_CROSS_TRIPLET})

if(MPS_CROSS_SYSROOT)
  # Everything the target links or includes is in the sysroot, the header-only packages too.
  set(CMAKE_SYSROOT ${MPS_CROSS_SYSROOT})
  set(CMAKE_FIND_ROOT_PATH ${MPS_CROSS_SYSROOT})
else()
  set(CMAKE_FIND_ROOT_PATH /opt/mpsteer-cross/${MPS_CROSS_DEB_ARCH} /)
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

if(MPS_CROSS_SYSROOT)
  # pkg-config (libbpf, lua5.4): the sysroot's .pc files, their paths prefixed with it.
  set(ENV{PKG_CONFIG_SYSROOT_DIR} ${MPS_CROSS_SYSROOT})
  set(ENV{PKG_CONFIG_LIBDIR}
      ${MPS_CROSS_SYSROOT}/usr/lib/${MPS_CROSS_TRIPLET}/pkgconfig:${MPS_CROSS_SYSROOT}/usr/share/pkgconfig)
  set(ENV{PKG_CONFIG_PATH} "")
  # The tests run under qemu-user with the sysroot's loader and libraries.
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MPS_CROSS_QEMU} -L ${MPS_CROSS_SYSROOT})
  # bpf/BpfObject.cmake compiles the BPF objects with the build machine's clang and
  # -I/usr/include/<multiarch> for <asm/types.h>, which only multiarch provides: the sysroot's
  # is the same header (the objects do not depend on it). A list: the compiler, then the flag.
  find_program(_mps_clang NAMES clang clang-14 REQUIRED)
  set(BPF_CLANG "${_mps_clang};-I${MPS_CROSS_SYSROOT}/usr/include/${MPS_CROSS_TRIPLET}"
      CACHE STRING "clang for the BPF objects, with the sysroot's asm headers" FORCE)
  # dpkg-shlibdeps (the .deb's Depends): look the libraries up in the sysroot;
  # packaging/package.sh points DPKG_ADMINDIR at the sysroot's dpkg database.
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
      ${MPS_CROSS_SYSROOT}/lib/${MPS_CROSS_TRIPLET} ${MPS_CROSS_SYSROOT}/usr/lib/${MPS_CROSS_TRIPLET})
else()
  # pkg-config (libbpf, lua5.4) must see the target's .pc files only.
  set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${MPS_CROSS_TRIPLET}/pkgconfig:/usr/share/pkgconfig)
  set(ENV{PKG_CONFIG_PATH} "")

  # Tests (ctest, catch_discover_tests) run the target's binaries under qemu-user with the
  # multiarch loader and libraries (libc6:<arch>, installed by setup-cross.sh), one glibc build
  # throughout. The cross toolchain's loader in /usr/<triplet> is an older glibc point release:
  # paired with the multiarch libc it hangs the first pthread_create.
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MPS_CROSS_QEMU} -L /)
endif()

# packaging/CPack.cmake: the package's architecture (CPack would ask dpkg for the build's).
set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE ${MPS_CROSS_DEB_ARCH})
