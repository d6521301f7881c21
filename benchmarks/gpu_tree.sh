#!/usr/bin/env bash
# What travels to a lent GPU machine with each call, and how to make it fit. The device tool copies the working tree's
# tracked files and its untracked files that git does not ignore, with the carried paths, 64 MiB in all a call; the
# committed references (results/reference/, about 100 MB of exported runs, tables and reports) are more than that on
# their own, and no GPU script reads them. So, around a lease:
#
#     bash benchmarks/gpu_tree.sh size       # bytes that would travel now, and how much room a carried part has
#     bash benchmarks/gpu_tree.sh slim       # before the first call: results/reference/ out of the index, ignored
#     bash benchmarks/gpu_tree.sh restore    # after the last call: the index as it was, the ignore line removed
#
# `slim` only touches git's index and .git/info/exclude, never a file: every reference stays on disk, and `restore`
# (`git reset -- results/reference`) puts the index back from HEAD. It refuses to run with staged changes, so that
# restore returns exactly the state before it; commit nothing between the two (a commit then would delete the
# references, and the fresh clone's tests of them would fail CI).
set -eu
cd "$(git rev-parse --show-toplevel)"
LIMIT=$((64 * 1024 * 1024))
SLIMMED=results/reference
MARK="/$SLIMMED/"
NOTE="# the next line: benchmarks/gpu_tree.sh slim (gitignore has no comments after a pattern)"
EXCLUDE=$(git rev-parse --git-path info/exclude)

size() {  # the tool's rule: tracked files (as on disk) and untracked files git does not ignore
    local bytes
    bytes=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 |
        cut -f1)
    echo "travels: $bytes bytes ($((bytes / 1048576)) MiB) of the $((LIMIT / 1048576)) MiB a call carries; room for" \
        "a carried part: $(((LIMIT - bytes) / 1048576)) MiB (benchmarks/gpu_prepare.sh's PART_MIB)"
}

case "${1:-size}" in
size) size ;;
slim)
    if grep -qxF "$MARK" "$EXCLUDE" 2>/dev/null; then
        echo "already slim (restore with: bash benchmarks/gpu_tree.sh restore)"
    elif ! git diff --cached --quiet; then
        echo "gpu_tree.sh: staged changes: commit or unstage them first, so that restore returns exactly this state" >&2
        exit 2
    else
        git rm -r -q --cached -- "$SLIMMED"
        mkdir -p "$(dirname "$EXCLUDE")" && printf '%s\n%s\n' "$NOTE" "$MARK" >>"$EXCLUDE"
        echo "slim: $SLIMMED out of the index and ignored (its files stay on disk); commit nothing until restore"
    fi
    size
    ;;
restore)
    git reset -q -- "$SLIMMED"
    if [ -e "$EXCLUDE" ]; then
        grep -vxF -e "$NOTE" -e "$MARK" "$EXCLUDE" >"$EXCLUDE.tmp" || true
        mv "$EXCLUDE.tmp" "$EXCLUDE"
    fi
    echo "restored: $SLIMMED back in the index, as at HEAD"
    size
    ;;
*)
    echo "usage: bash benchmarks/gpu_tree.sh [size|slim|restore]" >&2
    exit 2
    ;;
esac
