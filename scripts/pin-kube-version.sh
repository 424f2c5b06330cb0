#!/usr/bin/env bash
# Pin a Kubernetes release for the test control plane: write DIR/go.mod (and go.sum) requiring
# k8s.io/kubernetes VERSION with a `replace` line for each of its staging modules (k8s.io/api,
# k8s.io/apiserver, ... at v0.<minor>.<patch>), plus etcd's server as a tool, then `go mod tidy`.
# What DIR/go.mod held besides (tools/kube-bins: its `toolchain` line, the other test tools' `tool`
# lines, helm and promtool, and the direct requirements of karpenter-kwok/main.go) is kept, so that
# every Go test tool builds against the new release's libraries. Only through the Go module proxy;
# nothing else is downloaded.
#
#   scripts/pin-kube-version.sh v1.37.2 tools/kube-bins            # the main suite's server
#   scripts/pin-kube-version.sh v1.35.4 tools/kube-bins/compat/v1.35  # a compatibility run's
set -euo pipefail
VERSION=${1:?usage: pin-kube-version.sh vMAJOR.MINOR.PATCH DIR}
DIR=${2:?usage: pin-kube-version.sh vMAJOR.MINOR.PATCH DIR}
GO=${GPUHC_GO:-$(command -v go || echo /usr/local/go/bin/go)}
STAGING=v0.${VERSION#v1.}
mkdir -p "$DIR"
keep=()  # go mod edit flags: what the old go.mod held besides Kubernetes and etcd
if [[ -f "$DIR/go.mod" ]]; then
    toolchain=$(awk '$1 == "toolchain" { print $2; exit }' "$DIR/go.mod")
    [[ -z "$toolchain" || -n "${GOTOOLCHAIN:-}" ]] || export GOTOOLCHAIN=$toolchain
    json=$("$GO" mod edit -json "$DIR/go.mod")  # fails (and so stops the script) if go cannot read it
    flags=$(python3 -c '
import json, sys
m = json.load(sys.stdin)
ours = ("k8s.io/", "go.etcd.io/etcd/")
if m.get("Toolchain"):
    print("-toolchain=" + m["Toolchain"])
tools = [t["Path"] for t in m.get("Tool") or [] if not t["Path"].startswith(ours)]
for t in tools:
    print("-tool=" + t)
for r in m.get("Require") or []:
    path = r["Path"]
    of_tool = any(t == path or t.startswith(path + "/") for t in tools)
    if (of_tool or not r.get("Indirect")) and not path.startswith(ours):
        print("-require=%s@%s" % (path, r["Version"]))
' <<<"$json")
    [[ -z "$flags" ]] || mapfile -t keep <<<"$flags"
fi
src=$("$GO" mod download -json "k8s.io/kubernetes@$VERSION" | awk -F'"' '$2 == "GoMod" { print $4 }')
goline=$(awk '$1 == "go" { print $2; exit }' "$src")
{
    echo "// Module kube-bins pins the Kubernetes release whose kube-apiserver, kubectl,"
    echo "// kube-controller-manager and etcd the test suite builds from the Go module"
    echo "// proxy (see scripts/build-kube-bins.sh). It is never imported. Written by"
    echo "// scripts/pin-kube-version.sh $VERSION."
    if [[ ${#keep[@]} -gt 0 ]]; then
        echo "// It is also the module of the test suite's other Go tools (helm, promtool and"
        echo "// karpenter-kwok/), built with the same library versions and toolchain, so that what"
        echo "// they share compiles once (scripts/build-go-tools.sh)."
    fi
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
[[ ${#keep[@]} -eq 0 ]] || "$GO" mod edit "${keep[@]}" "$DIR/go.mod"
rm -f "$DIR/go.sum"
(cd "$DIR" && "$GO" mod tidy)
echo "pinned $VERSION in $DIR/go.mod ($(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ { print "etcd " $2 }' "$DIR/go.mod"))"
