#!/usr/bin/env bash
# Installs what `make test` needs on a fresh Debian machine: iproute2 (ip) and
# util-linux (unshare) for the loopback-only network namespaces the tests make,
# and the client programs of the real-client suite (test/clients): curl, git, and
# Debian's python3 with requests, httpx (with h2 for HTTP/2), aiohttp, pip, PyGithub
# (python3-github, for cmd/egressd's github_app test), and boto3 and the AWS CLI for the
# aws suite (test/aws).
# The suite runs /usr/bin/python3, which sees these packages (a pyenv or venv
# python3 earlier on PATH does not). A JDK (javac beside java: cmd/egressd runs a
# single-file Java client, `java Main.java`, to check egressd's PKCS#12 trust store).
# Node and undici: scripts/install-client-deps.sh.
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v git >/dev/null 2>&1 || need+=(git)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
[ -x /usr/bin/python3 ] || need+=(python3)
pymod() { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import $1" >/dev/null 2>&1; }
pymod requests || need+=(python3-requests)
pymod httpx || need+=(python3-httpx)
pymod h2 || need+=(python3-h2)
pymod aiohttp || need+=(python3-aiohttp)
pymod github || need+=(python3-github)
pymod pip || need+=(python3-pip)
# The aws suite (test/aws): Debian's boto3 and AWS CLI.
pymod boto3 || need+=(python3-boto3)
[ -x /usr/bin/aws ] || need+=(awscli)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-test-deps: need ${need[*]} (run as root or install them)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
