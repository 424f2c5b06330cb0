#!/usr/bin/env bash
# The compatibility run: every `kube`-marked test against the oldest supported Kubernetes minor and
# the one between it and the main suite's (tools/kube-bins/compat/*: v1.35.4, v1.36.3), one
# version after another, each with kube-bins built from the Go module proxy into
# .cache/kube-bins/<version>/ on first use (~5-9 min cold on 2 cores; seconds with warm Go caches).
# Not part of `make test` (its cold time must not grow): `make test-compat`.
#
#   scripts/test-compat.sh [VERSION_DIR...]   # default: every tools/kube-bins/compat/v*
#
# Prints one table row per version (passed, failed, skipped and why) and writes the same table to
# .cache/compat/table.md; each run's pytest log and JUnit XML are beside it. Exit 1 if any failed.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY=${PY:-$REPO/.venv/bin/python}
OUT=$REPO/.cache/compat
mkdir -p "$OUT"
dirs=("$@")
[[ ${#dirs[@]} -gt 0 ]] || dirs=("$REPO"/tools/kube-bins/compat/v*)
rc=0
rows=()
for d in "${dirs[@]}"; do
    d=$(cd "$d" && pwd)
    ver=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$d/go.mod")
    echo "test-compat: Kubernetes $ver ($d)" >&2
    if ! GPUHC_KUBE_MODULE=$d bash scripts/build-kube-bins.sh >"$OUT/$ver.build.log" 2>&1; then
        echo "test-compat: building $ver failed: $OUT/$ver.build.log" >&2
        rows+=("| $ver | build failed | | | see .cache/compat/$ver.build.log |")
        rc=1
        continue
    fi
    GPUHC_KUBE_MODULE=$d CI=true "$PY" -m pytest -m kube -p no:cacheprovider -q -rs \
        --junitxml="$OUT/$ver.xml" >"$OUT/$ver.log" 2>&1 || rc=1
    rows+=("$("$PY" scripts/junit-summary.py "$ver" "$OUT/$ver.xml")")
    tail -n 3 "$OUT/$ver.log" >&2
done
{
    echo "| Kubernetes | passed | failed | skipped | skipped: why |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
} | tee "$OUT/table.md"
exit $rc
