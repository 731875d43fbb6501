#!/usr/bin/env bash
# The device tool carries the working tree (tracked files included) plus `carry` paths, 64 MiB in all;
# .gpu/ alone is ~59 MiB, so the bundled models' weights step outside the tree for a device call.
#   bash scripts/device_tree.sh out [PATH ...]   # move assets' weights (> 1 MB) to ../device-held-assets, except PATHs
#   bash scripts/device_tree.sh in               # move them back (do this before any commit)
set -euo pipefail
cd "$(dirname "$0")/.."
HELD=../device-held-assets
case "${1:-}" in
  out)
    shift
    find assets -type f -size +1M | while read -r f; do
      for keep in "$@"; do [ "$f" = "$keep" ] && continue 2; done
      mkdir -p "$HELD/$(dirname "$f")" && mv "$f" "$HELD/$f"
    done ;;
  in)
    [ -d "$HELD" ] && (cd "$HELD" && find . -type f) | while read -r f; do
      mkdir -p "$(dirname "$f")" && mv "$HELD/$f" "$f"
    done
    rm -rf "$HELD" ;;
  *) echo "usage: $0 out [PATH ...] | in" >&2; exit 2 ;;
esac
# moved-out tracked files are listed but absent: du skips them (and exits 1)
tree=$({ git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null || true; } | tail -1 | cut -f1)
gpu=$(du -sb .gpu 2>/dev/null | cut -f1 || echo 0)
echo "tree $((tree / 1048576)) MiB + .gpu $((${gpu:-0} / 1048576)) MiB (a device call carries 64 MiB at most)"
