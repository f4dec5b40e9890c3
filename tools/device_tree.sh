#!/usr/bin/env bash
# The GPU machine's tool sends the checkout's tracked files, at most 64 MiB with what a call
# carries; the fixtures alone are larger. `slim` takes tests/fixtures and docs/archive out of
# the index (not out of the work tree, not out of HEAD) and ignores them locally, so a call
# sends the code; fixtures a run needs then travel by naming their folders in `carry`.
# `restore` puts the index and the ignore list back. Never commit between the two.
#
#   tools/device_tree.sh slim | restore
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=.git/info/exclude
paths=(tests/fixtures docs/archive)
case "${1:-}" in
slim)
    git diff --cached --quiet || { echo "the index has staged changes: commit them first" >&2; exit 1; }
    git rm -r -q --cached "${paths[@]}"
    for p in "${paths[@]}"; do grep -qx "/$p/" "$exclude" 2>/dev/null || echo "/$p/" >> "$exclude"; done
    echo "index slimmed; run tools/device_tree.sh restore after the device calls"
    ;;
restore)
    for p in "${paths[@]}"; do sed -i "\#^/$p/\$#d" "$exclude"; done
    git reset -q -- "${paths[@]}"
    git status --short | head
    ;;
*)
    echo "usage: tools/device_tree.sh slim | restore" >&2
    exit 2
    ;;
esac
