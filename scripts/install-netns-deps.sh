#!/usr/bin/env bash
# Installs what the transparent-mode tests need on a fresh Debian machine:
# iproute2 (ip, veth, ip netns), iptables (iptables, ip6tables and their -save
# forms, used by deploy/netns/egressd-netns and the Kubernetes init container)
# and nftables (nft, to inspect the nf_tables ruleset iptables-nft writes).
# Idempotent: installs only what is missing. Called by `make test`.
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
{ command -v iptables && command -v ip6tables && command -v iptables-save; } >/dev/null 2>&1 || need+=(iptables)
command -v nft >/dev/null 2>&1 || need+=(nftables)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-netns-deps: need ${need[*]} (run as root or install them)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
