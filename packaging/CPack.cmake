# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Debian packages with CPack: what goes where, and the package's metadata.
# Built by packaging/package.sh ARCH (amd64 natively, arm64/armhf through
# packaging/toolchain-ARCH.cmake); included at the end of the top-level CMakeLists.txt.
#
#   /usr/bin/mpsteer                      the binary (BPF skeletons and JSON Schemas embedded)
#   /usr/share/mpsteer/bpf/*.bpf.o        the same BPF objects, for inspection (bpftool, llvm-objdump)
#   /usr/share/mpsteer/schemas/*.json     the manifest JSON Schemas (editors, CI linting)
#   /usr/share/mpsteer/policies/lua/*.lua hook scripts, inside the policies (scripts resolve beneath the directory read)
#   /usr/share/mpsteer/policies/          example policies, one per use case
#   /usr/share/mpsteer/monitoring/        Prometheus alerting rules, Grafana dashboard
#   /lib/systemd/system/mpsteer.service   the agent on /etc/mpsteer/policies (not enabled)
#   /etc/default/mpsteer                  its options (conffile)
#   /etc/mpsteer/policies/                the operator's policies (shipped empty, never removed
#                                         while it holds files)
#   /usr/share/man/man8/mpsteer.8.gz      the manual page
#   /usr/share/doc/mpsteer/               README.md, docs/*.md (its pages; not their plots),
#                                         manifests.md (schemas/), lua-hooks.md (lua/),
#                                         copyright (DEP-5), changelog.gz (Debian changelog)
#   /usr/share/lintian/overrides/mpsteer  the BPF objects are EM_BPF ELF files in /usr/share

get_property(_mps_bpf_objects GLOBAL PROPERTY MPSTEER_BPF_OBJECTS)
install(FILES ${_mps_bpf_objects} DESTINATION share/mpsteer/bpf)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/schemas/ DESTINATION share/mpsteer/schemas
        FILES_MATCHING PATTERN "*.json")
install(DIRECTORY ${CMAKE_SOURCE_DIR}/lua/ DESTINATION share/mpsteer/policies/lua
        FILES_MATCHING PATTERN "*.lua")
install(DIRECTORY ${CMAKE_SOURCE_DIR}/policies/ DESTINATION share/mpsteer/policies
        FILES_MATCHING PATTERN "*.yaml")
# `mpsteer usecases --plots` draws with it (python3-matplotlib, suggested).
install(FILES ${CMAKE_SOURCE_DIR}/tools/plot_usecases.py DESTINATION share/mpsteer/tools)
install(FILES ${CMAKE_SOURCE_DIR}/monitoring/mpsteer.rules.yml
              ${CMAKE_SOURCE_DIR}/monitoring/mpsteer-dashboard.json
        DESTINATION share/mpsteer/monitoring)
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION share/doc/mpsteer)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs/ DESTINATION share/doc/mpsteer/docs
        FILES_MATCHING PATTERN "*.md" PATTERN "usecases" EXCLUDE)
# The manifest format and the Lua hook API, for operators writing policies.
install(FILES ${CMAKE_SOURCE_DIR}/schemas/README.md DESTINATION share/doc/mpsteer
        RENAME manifests.md)
install(FILES ${CMAKE_SOURCE_DIR}/lua/README.md DESTINATION share/doc/mpsteer RENAME lua-hooks.md)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/debian/copyright DESTINATION share/doc/mpsteer)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/debian/lintian-overrides
        DESTINATION share/lintian/overrides RENAME mpsteer)

# Absolute destinations: outside CPACK_PACKAGING_INSTALL_PREFIX (/usr).
install(FILES ${CMAKE_SOURCE_DIR}/packaging/debian/mpsteer.service
        DESTINATION /lib/systemd/system)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/debian/mpsteer.sysusers
        DESTINATION /usr/lib/sysusers.d RENAME mpsteer.conf)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/debian/mpsteer.default
        DESTINATION /etc/default RENAME mpsteer)
install(DIRECTORY DESTINATION /etc/mpsteer/policies)

# Debian wants manual pages and changelogs compressed, reproducibly (-n: no name or time
# stamp). The version has no Debian revision (a native package), so the changelog is
# changelog.gz, not changelog.Debian.gz.
set(_mps_man ${CMAKE_BINARY_DIR}/mpsteer.8.gz)
set(_mps_changelog ${CMAKE_BINARY_DIR}/changelog.gz)
add_custom_command(OUTPUT ${_mps_man}
  COMMAND gzip -9n -c ${CMAKE_SOURCE_DIR}/packaging/mpsteer.8 > ${_mps_man}
  DEPENDS ${CMAKE_SOURCE_DIR}/packaging/mpsteer.8
  COMMENT "man page mpsteer.8.gz")
add_custom_command(OUTPUT ${_mps_changelog}
  COMMAND gzip -9n -c ${CMAKE_SOURCE_DIR}/packaging/debian/changelog > ${_mps_changelog}
  DEPENDS ${CMAKE_SOURCE_DIR}/packaging/debian/changelog
  COMMENT "Debian changelog.gz")
add_custom_target(mpsteer_docs ALL DEPENDS ${_mps_man} ${_mps_changelog})
install(FILES ${_mps_man} DESTINATION share/man/man8)
install(FILES ${_mps_changelog} DESTINATION share/doc/mpsteer)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME mpsteer)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "mpsteer developers <dev@mpsteer.dev>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "declarative, eBPF-enforced Multipath TCP policies")
set(CPACK_PACKAGE_DESCRIPTION "\
mpsteer lets an operator extend Multipath TCP without touching the kernel:
policies are YAML manifests in a (git-synced) directory; the agent validates
them against JSON Schemas, compiles each into a chain of small eBPF programs at
XDP ingress and TC egress/ingress, and steers the kernel's MPTCP: hide or
re-inject ADD_ADDR, insert MP_PRIO, cap a subflow's rate, report MP_CAPABLE
and MP_JOIN. Lua hooks make decisions on events and timers.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_STRIP_FILES ON)  # install(TARGETS) only: the BPF objects keep their BTF

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # mpsteer_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://mpsteer.dev")
# Runtime dependencies from the binary's DT_NEEDED entries (dpkg-shlibdeps); for a cross build
# packaging/package.sh sets DEB_HOST_ARCH so the target architecture's libraries are looked up.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-matplotlib")  # mpsteer usecases --plots
# What `mpsteer demo`, `bench --live` and `usecases` run to build their lab (Lab::require_tools
# names them when missing); the agent itself needs none of them.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "iproute2, procps, ethtool")
if(MPS_CROSS_DEB_ARCH)  # packaging/toolchain-*.cmake
  set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE ${MPS_CROSS_DEB_ARCH})
endif()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${CMAKE_SOURCE_DIR}/packaging/debian/conffiles
  ${CMAKE_SOURCE_DIR}/packaging/debian/postinst
  ${CMAKE_SOURCE_DIR}/packaging/debian/prerm
  ${CMAKE_SOURCE_DIR}/packaging/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)  # 0755 scripts, 0644 the rest

include(CPack)
