#!/usr/bin/env bash
# Pin a Kubernetes release for the test control plane: write DIR/go.mod (and go.sum) requiring
# k8s.io/kubernetes VERSION with a `replace` line for each of its staging modules (k8s.io/api,
# k8s.io/apiserver, ... at v0.<minor>.<patch>), plus etcd's server as a tool, then `go mod tidy`.
# Only through the Go module proxy; nothing else is downloaded.
#
#   scripts/pin-kube-version.sh v1.37.2 tools/kube-bins            # the main suite's server
#   scripts/pin-kube-version.sh v1.35.4 tools/kube-bins/compat/v1.35  # a compatibility run's
set -euo pipefail
VERSION=${1:?usage: pin-kube-version.sh vMAJOR.MINOR.PATCH DIR}
DIR=${2:?usage: pin-kube-version.sh vMAJOR.MINOR.PATCH DIR}
GO=${GPUHC_GO:-$(command -v go || echo /usr/local/go/bin/go)}
STAGING=v0.${VERSION#v1.}
mkdir -p "$DIR"
src=$("$GO" mod download -json "k8s.io/kubernetes@$VERSION" | awk -F'"' '$2 == "GoMod" { print $4 }')
goline=$(awk '$1 == "go" { print $2; exit }' "$src")
{
    echo "// Module kube-bins pins the Kubernetes release whose kube-apiserver, kubectl,"
    echo "// kube-controller-manager and etcd the test suite builds from the Go module"
    echo "// proxy (see scripts/build-kube-bins.sh). It is never imported. Written by"
    echo "// scripts/pin-kube-version.sh $VERSION."
    echo "module github.com/gpu-healthcheck/gpu-healthcheck/tools/kube-bins"
    echo
    echo "go $goline"
    echo
    echo "tool ("
    echo "	go.etcd.io/etcd/server/v3"
    echo "	k8s.io/kubernetes/cmd/kube-apiserver"
    echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
    echo "	k8s.io/kubernetes/cmd/kubectl"
    echo ")"
    echo
    echo "require k8s.io/kubernetes $VERSION"
    echo
    echo "replace ("
    awk '$2 == "=>" && $3 ~ /^\.\/staging\// { printf "\t%s => %s '"$STAGING"'\n", $1, $1 }' "$src"
    echo ")"
} >"$DIR/go.mod"
rm -f "$DIR/go.sum"
(cd "$DIR" && "$GO" mod tidy)
echo "pinned $VERSION in $DIR/go.mod ($(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ { print "etcd " $2 }' "$DIR/go.mod"))"
