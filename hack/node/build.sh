#!/usr/bin/env bash
# Builds the real node's Kubernetes binaries, kubelet and kube-scheduler, from
# the control plane's wrapper module (hack/control-plane/kubernetes: their
# `tool` directives are there, so every dependency has the control plane's
# version), with the same flags and version ldflags as
# hack/control-plane/build.sh. Not run by `make test` (yet: issue 22, step 2).
#
# The binaries go beside the control plane's, in a directory of their own:
#   ${STALLEDPOLICY_CACHE:-~/.cache/stalledpolicy}/k8s/<kubernetes version>/node-bin/
# with a `complete` marker holding a fingerprint of the wrapper module and of
# this recipe; when it matches, nothing is built. The bin directory is printed
# on stdout (last line), everything else goes to stderr.
#
# Usage: build.sh          build unless the cache is complete
#        build.sh --check  exit 3 (building nothing) unless the cache is complete
#
# Environment: CONTROL_PLANE_BUILD_JOBS (go build -p, default 2), GOTOOLCHAIN.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
module="$here/../control-plane/kubernetes"
recipe=1
jobs=${CONTROL_PLANE_BUILD_JOBS:-2}
log() { printf 'node build: %s\n' "$*" >&2; }

k8s_version=$(go mod edit -json "$module/go.mod" | python3 -c '
import json, sys
for req in json.load(sys.stdin).get("Require") or []:
    if req["Path"] == "k8s.io/kubernetes":
        print(req["Version"]); break
else:
    sys.exit("k8s.io/kubernetes is not required by the wrapper go.mod")
')
cache_root=${STALLEDPOLICY_CACHE:-$HOME/.cache/stalledpolicy}
out_dir="$cache_root/k8s/$k8s_version"
bin_dir="$out_dir/node-bin"
marker="$bin_dir/complete"
binaries=(kubelet kube-scheduler)
fingerprint=$( (echo "node recipe=$recipe"; cat "$module/go.mod" "$module/go.sum") | sha256sum | cut -d' ' -f1)

all_present() { local b; for b in "${binaries[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done; }
complete() { [[ -f "$marker" ]] && [[ "$(head -n1 "$marker")" == "$fingerprint" ]] && all_present; }

if complete; then log "up to date in $bin_dir"; echo "$bin_dir"; exit 0; fi
if [[ "${1:-}" == "--check" ]]; then log "not built: run $here/build.sh"; exit 3; fi

mkdir -p "$bin_dir"
exec 9>"$bin_dir/.build.lock"
if ! flock -n 9; then log "another build of $bin_dir is running: waiting for it"; flock 9; fi
if complete; then log "built meanwhile in $bin_dir"; echo "$bin_dir"; exit 0; fi

export CGO_ENABLED=0
rm -f "$marker"
start=$(date +%s)
# as hack/control-plane/build.sh: upstream's version variables, a reproducible buildDate
k8s_build_date=$(cd "$module" && go list -mod=readonly -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
k8s_minor=${k8s_version#v1.}; k8s_minor=${k8s_minor%%.*}
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$k8s_build_date"
done
log "kubernetes $k8s_version: ${binaries[*]} (-p $jobs)"
(cd "$module" && go build -mod=readonly -buildvcs=false -p "$jobs" -trimpath -ldflags "$k8s_ldflags" -o "$bin_dir/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler)
all_present || { log "a binary is missing from $bin_dir after the build"; exit 1; }
{
    echo "$fingerprint"
    echo "kubernetes=$k8s_version"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) seconds=$(( $(date +%s) - start )) go=$(go env GOVERSION)"
} >"$marker"
log "done in $(( $(date +%s) - start ))s: $bin_dir"
echo "$bin_dir"
