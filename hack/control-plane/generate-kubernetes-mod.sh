#!/usr/bin/env bash
# Regenerates kubernetes/go.mod: a wrapper module whose only job is to build
# kube-apiserver, kube-controller-manager and kubectl (and, for hack/node/,
# kubelet and kube-scheduler) from k8s.io/kubernetes.
#
# Why a generator: k8s.io/kubernetes requires its staging modules (k8s.io/api,
# k8s.io/apiserver, ...) at v0.0.0 and replaces them with directories of its own
# tree, and a dependency's replace directives are ignored by Go. So the wrapper
# must replace every one of them with the published release of the same minor
# (v1.X.Y -> v0.X.Y). The list comes from upstream's go.mod, never typed by hand,
# so a new staging module in a later release is picked up.
#
# Usage: generate-kubernetes-mod.sh [v1.37.2]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=${1:-v1.37.2}
staging_version="v0.${version#v1.}"
module_dir="$here/kubernetes"

info=$(go mod download -json "k8s.io/kubernetes@$version")
upstream_gomod=$(printf '%s' "$info" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
upstream=$(go mod edit -json "$upstream_gomod")

read -r go_directive staging < <(printf '%s' "$upstream" | python3 -c '
import json, sys
mod = json.load(sys.stdin)
local = sorted(r["Old"]["Path"] for r in mod.get("Replace") or [] if r["New"]["Path"].startswith("./staging/"))
if not local:
    sys.exit("upstream go.mod has no ./staging replace directives: the layout changed, read it by hand")
print(mod["Go"], " ".join(local))
')

mkdir -p "$module_dir"
cd "$module_dir"
rm -f go.mod go.sum
go mod init stalledpolicy.dev/hack/control-plane/kubernetes >/dev/null 2>&1
go mod edit -go="$go_directive" -require="k8s.io/kubernetes@$version"
for path in $staging; do
    go mod edit -replace="$path=$path@$staging_version"
done
# kubelet and kube-scheduler: the real node of hack/node/ (built by hack/node/build.sh,
# not by build.sh); the same module, so the same versions of everything
for cmd in kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler; do
    go mod edit -tool="k8s.io/kubernetes/cmd/$cmd"
done
go mod tidy
echo "kubernetes/go.mod: k8s.io/kubernetes $version, $(wc -w <<<"$staging") staging modules at $staging_version" >&2
