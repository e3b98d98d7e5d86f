#!/usr/bin/env bash
# Runs helm-docs on the chart with the project's settings (values in values.yaml's
# order, the template charts/stalledpolicy-operator/README.md.gotmpl), building
# it first when the cache lacks it (build.sh). Extra arguments go to helm-docs:
#   run.sh             write charts/stalledpolicy-operator/README.md (make chart-docs)
#   run.sh --dry-run   print it instead (tests/unit/test_chart_docs.py compares)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
binary=$(bash "$here/build.sh")
exec "$binary" --chart-search-root "$repo/charts" --sort-values-order file --log-level warning "$@"
