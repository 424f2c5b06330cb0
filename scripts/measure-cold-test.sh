#!/usr/bin/env bash
# Time `make test` the way docs/testing.md's figures are measured: `.ci/run` on a fresh clone with empty
# caches (Go module cache, Go build cache, pip cache, no .cache/ of built tools), then, with
# --warm, a second `.ci/run` in the same clone (everything built, the Go caches full). With
# --tools-only, `scripts/build-go-tools.sh` instead of `.ci/run`: the Go test tools' cold build alone.
#
#   scripts/measure-cold-test.sh [--warm] [--keep] [--tools-only] [REV]   # REV: what to clone (default HEAD)
#
# Prints, for each run: the wall time, the CPU time of every process it started (the builds that
# `make test` detaches included: this script is their subreaper), the load average before and
# after, each Go tool's build time (.cache/go-tools/*.log) and pytest's summary lines. The figures
# mean something on a quiet machine only: say the load average with them. The clone, its caches
# (~10 GB) and its logs are in a temp dir, removed at the end unless --keep.
#
# Kept from the environment: Go itself, pip's index settings (PIP_INDEX_URL, PIP_FIND_LINKS) and
# GOPROXY. Needs python3 and git.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
warm=0 keep=0 rev=HEAD cmd=.ci/run
for arg in "$@"; do
    case $arg in
        --warm) warm=1 ;;
        --keep) keep=1 ;;
        --tools-only) cmd=scripts/build-go-tools.sh ;;
        -h | --help) sed -n '2,16p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) rev=$arg ;;
    esac
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpuhc-cold-XXXXXX")
cleanup() {
    if [[ $keep == 1 ]]; then
        echo "kept: $tmp"
    else
        chmod -R u+w "$tmp" 2>/dev/null || true  # Go's module cache is read-only
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT

git clone --quiet --no-hardlinks "$REPO" "$tmp/repo"
git -C "$tmp/repo" checkout --quiet --detach "$(git -C "$REPO" rev-parse "$rev")"
export GOCACHE=$tmp/gocache GOMODCACHE=$tmp/gomod PIP_CACHE_DIR=$tmp/pip-cache XDG_CACHE_HOME=$tmp/xdg
unset KUBEBUILDER_ASSETS GPUHC_KUBE_BIN_DIR GPUHC_HELM_BIN GPUHC_PROMTOOL_BIN GPUHC_KARPENTER_DIR \
    GPUHC_GO_TOOLS_LOG_DIR GPUHC_KUBE_NO_BUILD GPUHC_GO VIRTUAL_ENV

run_once() {  # $1: cold or warm
    local what=$1 log="$tmp/$1.log"
    echo "== $what: $cmd in $tmp/repo (log: $log)"
    python3 - "$tmp/repo" "$log" "$cmd" <<'EOF'
import ctypes, os, resource, subprocess, sys, time

repo, log, cmd = sys.argv[1], sys.argv[2], sys.argv[3]
ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: the detached builds come back to us
load0 = os.getloadavg()
t0 = time.monotonic()
with open(log, "wb") as out:
    rc = subprocess.call([os.path.join(repo, cmd)], cwd=repo, stdout=out, stderr=subprocess.STDOUT)
wall = time.monotonic() - t0
while True:  # reap what outlived .ci/run (a build still going, a server not stopped), with its CPU
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
load1 = os.getloadavg()
print(f"exit {rc}; wall {wall:.0f} s ({int(wall // 60)} min {wall % 60:.0f} s); "
      f"CPU {ru.ru_utime + ru.ru_stime:.0f} s (user {ru.ru_utime:.0f}, sys {ru.ru_stime:.0f}); "
      f"load average {load0[0]:.1f} before, {load1[0]:.1f} after")
EOF
    grep -h -E "built .* in [0-9]+s|built, [0-9]+s after|done in|FAILED" "$tmp"/repo/.cache/go-tools/*.log 2>/dev/null | sed 's/^/  /' || true
    grep -E "^(Go tools|kube:|\[gw[0-9]+\]|=+ .*(passed|failed|error).* in )" "$log" | sed 's/^/  /' || true
}

run_once cold
[[ $warm == 0 ]] || run_once warm
