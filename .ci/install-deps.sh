#!/usr/bin/env bash
# Installs the system packages and tools the tests use. Idempotent; non-interactive.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need_apt=()
command -v tshark >/dev/null 2>&1 || need_apt+=(tshark)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v ethtool >/dev/null 2>&1 || need_apt+=(ethtool)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections || true
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
python3 -c 'import scapy.contrib.roce' 2>/dev/null || python3 -m pip install -q scapy
# nic-drivers netns tests ping across namespaces.
command -v ping >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends iputils-ping; }
