#!/usr/bin/env bash
# Debian packages the tests and the demo need: a real redis-server (and
# redis-cli for cluster creation), openssl (the TLS tests make a self-signed
# certificate), Python's venv module (Debian ships ensurepip apart, in
# python3-venv / python3.X-venv) and mmdebstrap (`make image` builds the
# product's image from Debian's packages without a container engine). Go (1.26+) must be on the machine already;
# the control plane is built from Go modules by hack/control-plane/build.sh.
set -euo pipefail
python="${PYTHON:-python3}"
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v openssl >/dev/null || missing+=(openssl)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  # the package named for the interpreter's own version (python3.11-venv), which
  # python3-venv depends on for the default python3 only
  missing+=("$("$python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}-venv")')")
fi
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  sudo=()
  if ((EUID != 0)); then
    if ! command -v sudo >/dev/null; then
      echo "error: not root and no sudo: install them as root (apt-get install ${missing[*]}), then run make again" >&2
      exit 1
    fi
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
