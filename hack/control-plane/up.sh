#!/usr/bin/env bash
# The local control plane for people: builds the binaries when missing, then
#   up.sh up     start etcd, kube-apiserver, kube-controller-manager (detached);
#                prints `export KUBECONFIG=... PATH=...` lines, so:
#                eval "$(hack/control-plane/up.sh up)"
#   up.sh env    print those lines again for a running plane
#   up.sh down   stop it and remove its state directory
# State (TLS material, etcd data, logs, kubeconfig): ~/.cache/stalledpolicy/plane/,
# or --state-dir DIR. The one implementation is stalledpolicy.devenv.controlplane.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
if [[ -x "$repo/.venv/bin/python" && -z "${PYTHON:-}" ]]; then
    python="$repo/.venv/bin/python"
fi
export PYTHONPATH="$repo/operator${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m stalledpolicy.devenv.controlplane "${@:-up}"
