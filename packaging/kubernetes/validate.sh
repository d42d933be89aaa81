#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# Validates the Kubernetes manifests in this directory the way `kubectl apply --dry-run=client`
# would check their shape: kubernetes-validate (PyPI) with the OpenAPI-derived JSON Schemas it
# bundles, --strict (unknown fields are errors), for the oldest and the newest Kubernetes we
# claim. Offline once installed; the tool lives in a venv in /opt/mpsteer-tools.
set -eu
cd "$(dirname "$0")"
VENV=/opt/mpsteer-tools/kubernetes-validate
VERSION=1.37.0
if [ ! -e "$VENV/.installed-$VERSION" ]; then
    dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed" ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
    echo "kubernetes: installing kubernetes-validate $VERSION into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "kubernetes-validate==$VERSION"
    touch "$VENV/.installed-$VERSION"
fi
for k in 1.28.0 1.37.0; do
    "$VENV/bin/kubernetes-validate" --strict --kubernetes-version "$k" *.yaml
done
