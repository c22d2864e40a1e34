#!/usr/bin/env bash
# Extract the SGLang files the plugin's real-side tests load, at one commit,
# from a local git copy of SGLang, into a folder that .gitignore lists:
#
#   python/tests/sglang_copy.sh <sglang git dir> <commit> [dest, default .sglang]
#   export STRATA_SGLANG_DIR=$PWD/.sglang
#   STRATA_SGLANG_SIDE=real /usr/bin/python3 -m pytest -q python/tests
#
# SGLang's code is read and run here, never committed: the destination must be
# ignored by git (the script refuses otherwise). It writes the commit to COMMIT
# so that the tests can name what they ran against.
set -euo pipefail
src=${1:?usage: sglang_copy.sh <sglang git dir> <commit> [dest]}
commit=${2:?usage: sglang_copy.sh <sglang git dir> <commit> [dest]}
dest=${3:-.sglang}
repo=$(git rev-parse --show-toplevel)
case "$dest" in /*) ;; *) dest="$PWD/$dest" ;; esac
mkdir -p "$dest"
if ! git -C "$repo" check-ignore -q "$dest/x"; then
  echo "sglang_copy.sh: $dest is not ignored by git; SGLang's files must never be committed" >&2
  exit 2
fi
full=$(git -C "$src" rev-parse --verify "$commit^{commit}")
files=(
  python/sglang/srt/environ.py
  python/sglang/srt/runtime_context.py
  python/sglang/srt/mem_cache/hicache_storage.py
  python/sglang/srt/mem_cache/storage/__init__.py
  python/sglang/srt/mem_cache/storage/backend_factory.py
  python/sglang/srt/mem_cache/storage/mmap/__init__.py
  python/sglang/srt/mem_cache/storage/mmap/mmap_allocator.py
  python/sglang/srt/mem_cache/pool_host/__init__.py
  python/sglang/srt/mem_cache/pool_host/base.py
  python/sglang/srt/mem_cache/pool_host/common.py
  python/sglang/srt/mem_cache/pool_host/hisparse.py
  python/sglang/srt/mem_cache/pool_host/mha.py
  python/sglang/srt/mem_cache/pool_host/mla.py
  python/sglang/srt/mem_cache/memory_pool_host.py
  python/sglang/srt/mem_cache/l2_transfer.py
  python/sglang/srt/managers/cache_controller.py
  python/sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py
)
rm -rf "$dest/python"
git -C "$src" archive "$full" "${files[@]}" | tar -x -C "$dest"
echo "$full" > "$dest/COMMIT"
echo "SGLang $full: ${#files[@]} files in $dest"
