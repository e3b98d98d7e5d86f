#!/usr/bin/env bash
# Debian packages the tests and the demo need: a real redis-server (and
# redis-cli for cluster creation), and openssl (the TLS tests make a
# self-signed certificate). Go (1.26+) is on the machine already; the control
# plane is built from Go modules by hack/control-plane/build.sh.
set -euo pipefail
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v openssl >/dev/null || missing+=(openssl)
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
