#!/usr/bin/env bash
# Builds BVLC Caffe 99bd997 with the Perseus patch (CPU_ONLY) against this checkout's
# libperseus.so, and prints the path of the `caffe` tool.
#
#   bash patches/bvlc_caffe/build.sh              # -> <cache>/build/tools/caffe
#   bash patches/bvlc_caffe/build.sh --cache-dir  # prints <cache> and stops
#
# The source is Debian's package caffe 1.0.0+git20180821.99bd997-8 (bullseye), whose
# orig tarball is exactly BVLC commit 99bd997; it is fetched with `apt-get source`
# through a private apt configuration under the cache (the system's sources are left
# alone). Everything lives in $PERSEUS_CAFFE_CACHE, by default outside the checkout so
# that every clone on a machine shares one build: ${XDG_CACHE_HOME:-~/.cache}/perseus/
# bvlc_caffe-<key>, the key a hash of the patches and this script (what makes the tree
# and its configuration). Perseus's C headers are copied into the cache (perseus_include/,
# a file only when its content changed), and the build compiles against that copy: a
# changed header recompiles only the files that include it (perseus_sync.cpp and
# solver.cpp: 24 s at load 5), and another clone recompiles nothing (the compile lines
# name no path of the checkout; its libperseus.so is only relinked: 4 s). With the
# headers in the key, every change of perseus.h made a cold build, and every clone's
# own include path changed every compile line, which rebuilt all 111 steps (371 s in a
# loaded CI run). The compiles go through ccache where it is installed, so a cold
# build of a new key reuses the objects of the previous one. A run that finds the build only checks and
# returns (seconds); a cold one takes about 4 minutes on a quiet 2-core machine. The
# tool links libperseus.so through its RUNPATH, which LD_LIBRARY_PATH overrides: run it with
# LD_LIBRARY_PATH=<checkout>/perseus/lib (tests/caffe/caffe_job.py does), so that each
# clone's tool uses that clone's core.
# Needs the build dependencies: patches/bvlc_caffe/install_deps.sh installs them.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# 0_*: builds 99bd997 against Debian 12's libraries; 1_*: the Perseus patch.
PATCHES=("$HERE"/[0-9]_*.patch)
JOBS=${JOBS:-2}
KEY=$(cat "${PATCHES[@]}" "$HERE/build.sh" | sha256sum | cut -c1-16)
SHARED=${XDG_CACHE_HOME:-$HOME/.cache}/perseus
CACHE=${PERSEUS_CAFFE_CACHE:-$SHARED/bvlc_caffe-$KEY}
[ "${1:-}" = --cache-dir ] && { echo "$CACHE"; exit 0; }

VERSION=1.0.0+git20180821.99bd997-8
ORIG=caffe_1.0.0+git20180821.99bd997.orig.tar.gz
# sha256 of the orig tarball, as listed in the .dsc that Debian's signed Sources index
# vouches for (apt checks that chain while downloading; we check the result again).
ORIG_SHA256=e0eb3f06794f7402c77b7dec8e8480273ee1a1bb192e9122b621a69d4147ad0c
# A file of the tree the patch edits, as at BVLC commit 99bd997.
SOLVER_SHA256=ec7c92f0d353dee7d68778bf91fd68b05adb538b32882b0a5f02b5db0f7f6423

LIB_DIR=$REPO/perseus/lib
INCLUDE_DIR=$CACHE/perseus_include  # this checkout's csrc/include/perseus/*.h, copied below
[ -f "$LIB_DIR/libperseus.so" ] || {
  echo "build.sh: $LIB_DIR/libperseus.so is missing: build Perseus first" \
       "(python setup.py build_ext --inplace, or scripts/setup.sh)" >&2; exit 1; }

mkdir -p "$CACHE"
# Clones that set up at once (or a test beside a setup) build once: the second waits
# for the first and finds its build. The lock file names its holder, so that the one
# waiting can say for whom (it waited without a word before).
exec 9<>"$CACHE.lock"
if ! flock -n 9; then
  echo "build.sh: waiting for another build of this Caffe to end: $(cat "$CACHE.lock" 2>/dev/null)" \
       "holds $CACHE.lock (a cold build takes about 4 minutes on 2 cores; then this" \
       "one finds it built)" >&2
  flock 9
fi
printf 'pid %s (build.sh of %s, since %s)' "$$" "$REPO" "$(date '+%H:%M:%S')" > "$CACHE.lock"
cd "$CACHE"

# ---- 1. the pristine source, verified -------------------------------------------
fetch() {
  local apt=$CACHE/apt
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" dl
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-bullseye-stable.gpg]" \
       "http://deb.debian.org/debian bullseye main" > "$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
              -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" -q update >/dev/null
  (cd dl && apt-get "${opts[@]}" -q source --download-only "caffe=$VERSION" >/dev/null)
}
[ -f "dl/$ORIG" ] || fetch
echo "$ORIG_SHA256  dl/$ORIG" | sha256sum -c --quiet - || {
  echo "build.sh: dl/$ORIG is not the 99bd997 tarball (sha256 mismatch)" >&2; exit 1; }

# ---- 2. the patched tree ------------------------------------------------------------
# src.patch holds the patches applied to src/. When they change, the tree is made
# afresh in src.new and only the files whose content differs are copied into src/,
# so the build directory recompiles only what the change touches.
# The cache may sit inside a git checkout: stop git from finding it, so that
# `git apply` patches the tree as a plain tree.
if ! cat "${PATCHES[@]}" | cmp -s - src.patch; then
  rm -rf src.new && mkdir src.new
  tar -xzf "dl/$ORIG" -C src.new
  echo "$SOLVER_SHA256  src.new/src/caffe/solver.cpp" | sha256sum -c --quiet - || {
    echo "build.sh: the tarball's tree is not 99bd997" >&2; exit 1; }
  for patch in "${PATCHES[@]}"; do
    (cd src.new && GIT_CEILING_DIRECTORIES="$CACHE" git apply "$patch")
  done
  if [ -d src ]; then
    (cd src && find . -type f) | while read -r f; do
      [ -e "src.new/$f" ] || rm "src/$f"
    done
    (cd src.new && find . -type f) | while read -r f; do
      cmp -s "src.new/$f" "src/$f" || { mkdir -p "src/$(dirname "$f")"; cp "src.new/$f" "src/$f"; }
    done
    rm -rf src.new
  else
    mv src.new src
  fi
  cat "${PATCHES[@]}" > src.patch
fi

# ---- 3. this checkout's C headers ---------------------------------------------------
# Copied only where the content differs (cmp), so that ninja sees a newer file only
# for a header that changed. Under the lock: one build at a time owns the copy. (A
# clone whose headers differ rebuilds the tool in place; a job of another clone that
# starts the tool during that rebuild gets the new one.)
mkdir -p "$INCLUDE_DIR/perseus"
for header in "$REPO"/csrc/include/perseus/*.h; do
  cmp -s "$header" "$INCLUDE_DIR/perseus/${header##*/}" || cp "$header" "$INCLUDE_DIR/perseus/"
done
for copied in "$INCLUDE_DIR"/perseus/*.h; do
  [ -e "$REPO/csrc/include/perseus/${copied##*/}" ] || rm "$copied"
done

# ---- 4. build the library and the tool --------------------------------------------
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# ccache: paths inside this cache folder hashed as relative ones, so that the build of
# another key hits the objects that did not change.
export CCACHE_BASEDIR=$CACHE
# Configured again when the cached build links another checkout's libperseus (the cache
# is shared by every clone on the machine, and that clone may be gone): the objects stay;
# -U drops the library that find_library cached for the old path.
linked=$(sed -n 's/^Perseus_LIBRARY:[A-Z]*=//p' build/CMakeCache.txt 2>/dev/null || true)
if [ "$linked" != "$LIB_DIR/libperseus.so" ]; then
  # CMAKE_POLICY_VERSION_MINIMUM: CMake 4 refuses Caffe's cmake_minimum_required(2.8.7).
  cmake -S src -B build "${GEN[@]}" "${LAUNCHER[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCPU_ONLY=ON -DBLAS=Open \
    -DUSE_OPENCV=OFF -DUSE_LEVELDB=OFF -DUSE_LMDB=OFF \
    -DBUILD_python=OFF -DBUILD_matlab=OFF -DBUILD_docs=OFF \
    -DUSE_PERSEUS=ON -DPERSEUS_LIBRARY_PATH="$LIB_DIR" -DPERSEUS_INCLUDE_DIR="$INCLUDE_DIR" \
    -UPerseus_LIBRARY \
    > build.configure.log 2>&1 || { cat build.configure.log >&2; exit 1; }
fi
cmake --build build --target caffe.bin -j "$JOBS" > build.log 2>&1 || {
  tail -50 build.log >&2; echo "build.sh: build failed, see $CACHE/build.log" >&2; exit 1; }
echo "$CACHE/build/tools/caffe"
