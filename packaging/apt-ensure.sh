#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Installs those of the given Debian packages that are missing (apt-get runs only then).
# Used by setup-deps.sh and setup-cross.sh. Usage: packaging/apt-ensure.sh WHO PACKAGE...
set -eu
who=$1
shift
missing=""
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -n "$missing" ] || exit 0
echo "$who: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
# A mirror caught mid-sync fails one index now and then (more likely with foreign architectures
# added for cross-building): retry, then install with the lists that did arrive.
for try in 1 2 3; do
    apt-get update -q && break
    echo "$who: apt-get update failed (try $try)"
    [ "$try" = 3 ] || sleep 10
done
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing
