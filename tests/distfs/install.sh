#!/usr/bin/env bash
# Install the GlusterFS test bed's Debian packages (glusterfs-server, glusterfs-client) if they are missing.
# Idempotent and quiet: prints one line saying what it did; exits 0 if they were already there.
set -euo pipefail

packages=(glusterfs-server glusterfs-client)

missing=()
for pkg in "${packages[@]}"; do
    # dpkg-query prints "install ok installed" only for a fully installed package.
    if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "distfs: ${packages[*]} already installed"
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    echo "distfs: cannot install ${missing[*]}: not root" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Only refresh the package lists when apt does not know the package yet (a fresh machine has empty lists).
if ! apt-cache show "${missing[0]}" >/dev/null 2>&1; then
    if ! timeout 300 apt-get update -qq >"$log" 2>&1; then
        cat "$log" >&2; echo "distfs: apt-get update failed" >&2; exit 1
    fi
    updated=" (after apt-get update)"
else
    updated=""
fi
# The packages' postinst may try to start glusterd through systemd; there is no systemd here, which is harmless.
if ! timeout 600 apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    cat "$log" >&2; echo "distfs: apt-get install ${missing[*]} failed" >&2; exit 1
fi
echo "distfs: installed ${missing[*]}${updated}"
