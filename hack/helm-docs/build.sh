#!/usr/bin/env bash
# Builds helm-docs (github.com/norwoodj/helm-docs), which writes the chart's
# README.md from charts/stalledpolicy-operator/README.md.gotmpl and the "# --"
# comments of its values.yaml, from the wrapper module beside this script: its
# go.mod names the command as a tool directive and pins the version, its go.sum
# every dependency. Built as hack/control-plane/build.sh builds the control
# plane (-mod=readonly, CGO_ENABLED=0, -trimpath), into a version-keyed cache
# outside the repository:
#   ${STALLEDPOLICY_CACHE:-~/.cache/stalledpolicy}/helm-docs/<version>/bin/helm-docs
# A marker file there holds a fingerprint of go.mod, go.sum and this recipe;
# when it matches, nothing is built (an up-to-date check costs a few
# milliseconds). The binary's path is printed on stdout (last line), everything
# else goes to stderr.
#
# Usage: build.sh          build unless the cache is complete
#        build.sh --check  exit 3 (building nothing) unless the cache is complete
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# Bump when the flags below change, so that caches built the old way are rebuilt.
recipe=2
module=github.com/norwoodj/helm-docs

log() { printf 'helm-docs build: %s\n' "$*" >&2; }

# The version go.mod requires, read without the go command (so --check works without Go).
version=$(awk -v m="$module" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$here/go.mod")
[[ -n "$version" ]] || { log "$module is not required by $here/go.mod"; exit 1; }

cache_root=${STALLEDPOLICY_CACHE:-$HOME/.cache/stalledpolicy}
out_dir="$cache_root/helm-docs/$version"
binary="$out_dir/bin/helm-docs"
marker="$out_dir/complete"
fingerprint=$( (echo "recipe=$recipe"; cat "$here/go.mod" "$here/go.sum") | sha256sum | cut -d' ' -f1)

complete() { [[ -f "$marker" ]] && [[ "$(head -n1 "$marker")" == "$fingerprint" ]] && [[ -x "$binary" ]]; }

if complete; then
    echo "$binary"
    exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
    log "not built (or built from another go.mod/go.sum): run $here/build.sh (or make helm-docs)"
    exit 3
fi
command -v go >/dev/null || { log "go is not on the PATH: Go 1.26+ is needed to build helm-docs"; exit 1; }

mkdir -p "$out_dir"
exec 9>"$out_dir/.build.lock"
if ! flock -n 9; then
    log "another build of $out_dir is running: waiting for it"
    flock 9
fi
if complete; then
    echo "$binary"
    exit 0
fi

export CGO_ENABLED=0
rm -f "$marker"
mkdir -p "$out_dir/bin"
start=$(date +%s)
log "$module $version"
(cd "$here" && go build -mod=readonly -buildvcs=false -p "${CONTROL_PLANE_BUILD_JOBS:-2}" -trimpath \
    -ldflags "-s -w -X main.version=${version#v}" -o "$binary" "$module/cmd/helm-docs")
[[ -x "$binary" ]] || { log "$binary is missing after the build"; exit 1; }
{
    echo "$fingerprint"
    echo "helm-docs=$version"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) seconds=$(( $(date +%s) - start )) go=$(go env GOVERSION)"
} >"$marker"
log "done in $(( $(date +%s) - start ))s: $binary"
echo "$binary"
