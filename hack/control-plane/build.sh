#!/usr/bin/env bash
# Builds the local Kubernetes control plane from Go modules: kube-apiserver,
# kube-controller-manager and kubectl (k8s.io/kubernetes), etcd
# (go.etcd.io/etcd/server/v3) and helm (helm.sh/helm/v4), each from a wrapper
# module of ours (kubernetes/, etcd/, helm/) whose go.mod and go.sum pin every
# dependency.
#
# The binaries go to a version-keyed cache outside the repository:
#   ${STALLEDPOLICY_CACHE:-~/.cache/stalledpolicy}/k8s/<kubernetes version>/bin/
# A marker file there holds a fingerprint of the wrapper modules and of the
# build recipe; when it matches, nothing is built. The bin directory is printed
# on stdout (last line), everything else goes to stderr.
#
# Usage: build.sh          build unless the cache is complete
#        build.sh --check  exit 3 (building nothing) unless the cache is complete
#
# Environment:
#   CONTROL_PLANE_BUILD_JOBS  go build -p (default 2; the machine has 2 cores)
#   GOTOOLCHAIN               honoured as usual (the modules need go >= 1.26.0)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# Bump when the flags below change, so that caches built the old way are rebuilt.
recipe=1
jobs=${CONTROL_PLANE_BUILD_JOBS:-2}

log() { printf 'control-plane build: %s\n' "$*" >&2; }

require_version() {  # <module dir> <module path>: the version the wrapper's go.mod requires
    go mod edit -json "$here/$1/go.mod" | python3 -c '
import json, sys
want = sys.argv[1]
for req in json.load(sys.stdin).get("Require") or []:
    if req["Path"] == want:
        print(req["Version"]); break
else:
    sys.exit(f"{want} is not required by the wrapper go.mod")
' "$2"
}

k8s_version=$(require_version kubernetes k8s.io/kubernetes)
etcd_version=$(require_version etcd go.etcd.io/etcd/server/v3)
helm_version=$(require_version helm helm.sh/helm/v4)

cache_root=${STALLEDPOLICY_CACHE:-$HOME/.cache/stalledpolicy}
out_dir="$cache_root/k8s/$k8s_version"
bin_dir="$out_dir/bin"
marker="$out_dir/complete"
binaries=(kube-apiserver kube-controller-manager kubectl etcd helm)

fingerprint=$( (echo "recipe=$recipe"; cd "$here" && cat kubernetes/go.mod kubernetes/go.sum etcd/go.mod etcd/go.sum \
    helm/go.mod helm/go.sum) | sha256sum | cut -d' ' -f1)

all_present() {
    local name
    for name in "${binaries[@]}"; do [[ -x "$bin_dir/$name" ]] || return 1; done
}

complete() { [[ -f "$marker" ]] && [[ "$(head -n1 "$marker")" == "$fingerprint" ]] && all_present; }

if complete; then
    log "up to date in $bin_dir"
    echo "$bin_dir"
    exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
    log "not built (or built from other go.mod/go.sum): run $here/build.sh"
    exit 3
fi

# One build at a time (the tests, make and people may all ask at once); whoever
# waited finds the cache complete.
mkdir -p "$out_dir"
exec 9>"$out_dir/.build.lock"
if ! flock -n 9; then
    log "another build of $out_dir is running: waiting for it"
    flock 9
fi
if complete; then
    log "built meanwhile in $bin_dir"
    echo "$bin_dir"
    exit 0
fi

module_time() {  # <module dir> <module path>: the release's commit time, for a reproducible buildDate
    (cd "$here/$1" && go list -mod=readonly -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' "$2")
}

export CGO_ENABLED=0
rm -f "$marker"
mkdir -p "$bin_dir"
start=$(date +%s)

# Version variables as upstream's hack/lib/version.sh sets them, so that
# `kubectl version` and /version report the real release instead of v0.0.0-master.
k8s_build_date=$(module_time kubernetes k8s.io/kubernetes)
k8s_minor=${k8s_version#v1.}; k8s_minor=${k8s_minor%%.*}
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$k8s_build_date"
done
log "kubernetes $k8s_version: kube-apiserver kube-controller-manager kubectl (-p $jobs)"
(cd "$here/kubernetes" && go build -mod=readonly -buildvcs=false -p "$jobs" -trimpath -ldflags "$k8s_ldflags" -o "$bin_dir/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl)

log "etcd $etcd_version"
(cd "$here/etcd" && go build -mod=readonly -buildvcs=false -p "$jobs" -trimpath -ldflags "-s -w" -o "$bin_dir/etcd" \
    go.etcd.io/etcd/server/v3)

log "helm $helm_version"
helm_ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
(cd "$here/helm" && go build -mod=readonly -buildvcs=false -p "$jobs" -trimpath -ldflags "$helm_ldflags" -o "$bin_dir/helm" \
    helm.sh/helm/v4/cmd/helm)

all_present || { log "a binary is missing from $bin_dir after the build"; exit 1; }
{
    echo "$fingerprint"
    echo "kubernetes=$k8s_version etcd=$etcd_version helm=$helm_version"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) seconds=$(( $(date +%s) - start )) go=$(go env GOVERSION)"
} >"$marker"
log "done in $(( $(date +%s) - start ))s: $bin_dir"
echo "$bin_dir"
