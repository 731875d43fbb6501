#!/usr/bin/env bash
# The device tool carries the working tree (tracked files included) plus `carry` paths, 64 MiB in all;
# .gpu/ alone is ~50 MiB, so the bundled models' weights and the raw logs step outside the tree for a
# device call (with .gpu/whl's jedi wheel), and the models a call needs travel xz-compressed in .gpu/models (unpack them there with
# `mkdir -p /tmp/models && for m in .gpu/models/*.tar.xz; do tar xJf $m -C /tmp/models; done`).
#   bash scripts/device_tree.sh out [MODEL_DIR ...]  # weights (> 1 MB) and logs to ../device-held-assets;
#                                                    # each MODEL_DIR (e.g. assets/glm5-geometry-carry)
#                                                    # packed into .gpu/models first
#   bash scripts/device_tree.sh in                   # move them back (do this before any commit)
set -euo pipefail
cd "$(dirname "$0")/.."
HELD=../device-held-assets
mode=${1:-}
case "$mode" in
  out)
    shift
    rm -rf .gpu/models && mkdir -p .gpu/models
    # SGLang and its JIT cache travel xz-compressed (13.4 -> 8.7 MB and 9.0 -> 2.2 MB as gzip came; session
    # 29), which leaves room for .gpu/deepgemm; device_env.sh unpacks them with xz, as the models are.
    # A jitcache.tar.gz copied back from a device call joins the carried one (a call returns only the
    # modules its machine held, so the union keeps every module any call compiled).
    for gz in .gpu/carry/jitcache.tar.gz .gpu/carry/sglang-0.5.23-trimmed.tar.gz; do
      [ -f "$gz" ] || continue
      xz=${gz%.gz}.xz
      merge=$(mktemp -d)
      [ "$gz" = .gpu/carry/jitcache.tar.gz ] && [ -f "$xz" ] && tar xJf "$xz" -C "$merge"
      tar xzf "$gz" -C "$merge"
      tar cf - -C "$merge" . | xz -T2 -9 > "$xz.part" && mv "$xz.part" "$xz" && rm -rf "$gz" "$merge"
    done
    [ -f .gpu/device_env.sh ] && sed -i -e 's/tar xzf "\$_G\/carry\/\([a-z0-9.-]*\)\.tar\.gz"/tar xJf "$_G\/carry\/\1.tar.xz"/g' \
      -e 's/-f "\$_G\/carry\/jitcache\.tar\.gz"/-f "$_G\/carry\/jitcache.tar.xz"/' .gpu/device_env.sh
    for model in "$@"; do
      tar cf - -C "$(dirname "$model")" "$(basename "$model")" | xz -T2 -6 > ".gpu/models/$(basename "$model").tar.xz"
    done
    # jedi (4.9 MB) is an ipython dependency that no server imports (IPython guards it), and no device
    # step reads the committed figures and result files (1.7 MB): their room carries the peer's wheels
    { find assets -type f -size +1M; git ls-files benchmarks | grep -E '/logs/|\.(png|jsonl|tar\.gz|log)$'
      ls .gpu/whl/jedi-*.whl 2>/dev/null; } |
    while read -r f; do
      [ -f "$f" ] || continue
      mkdir -p "$HELD/$(dirname "$f")" && mv "$f" "$HELD/$f"
    done ;;
  in)
    [ -d "$HELD" ] && (cd "$HELD" && find . -type f) | while read -r f; do
      mkdir -p "$(dirname "$f")" && mv "$HELD/$f" "$f"
    done
    rm -rf "$HELD" ;;
  *) echo "usage: $0 out [MODEL_DIR ...] | in" >&2; exit 2 ;;
esac
# moved-out tracked files are listed but absent: du skips them (and exits 1)
[ "$mode" = out ] || exit 0  # the sizes below are what a device call would carry
tree=$({ git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null || true; } | tail -1 | cut -f1)
size() { du -cb "$@" 2>/dev/null | tail -1 | cut -f1; }
mib() { echo "$(($1 / 1048576)).$(($1 % 1048576 * 10 / 1048576)) MiB"; }
# 63 MiB, not 64: the device's count runs above du's (session 28: a call refused at 63.7 MiB by du)
room=$((63 << 20))
base=$((tree + $(size .gpu/carry .gpu/whl .gpu/stub .gpu/device_env.sh .gpu/models)))
peer=$((base + $(size .gpu/peer)))
deepgemm=$((peer + $(size .gpu/deepgemm)))
fits() { [ "$1" -le "$room" ] && echo "fits" || echo "OVER: leave it out"; }
echo "the tree and carry [.gpu/carry, .gpu/whl, .gpu/stub, .gpu/device_env.sh, .gpu/models]: $(mib $base), $(fits $base)"
echo "  + .gpu/peer (sgl-flash-mla: FlashMLA, the suite's FlashMLA and peer cases): $(mib $peer), $(fits $peer)"
echo "  + .gpu/deepgemm (only SGLang's own path's indexer): $(mib $deepgemm), $(fits $deepgemm)"
