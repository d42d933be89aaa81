#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Installs what is missing (Debian packages), then configures and builds mpsteer in ./build.
set -eu
cd "$(dirname "$0")/.."
packaging/setup-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -Wno-dev >/dev/null
ninja -C build
