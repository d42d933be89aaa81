#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# The main job on the built-in default: build, then run mpsteer's demo — a two-namespace MPTCP
# lab where the agent applies the shipped policies to live MPTCP traffic, then `mpsteer status`.
# Needs root. Cleans up after itself.
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (it creates network namespaces and loads BPF)" >&2; exit 1; }
packaging/build.sh
exec build/src/cli/mpsteer demo "$@"
