#!/bin/sh
# Copies an unpacked cuDNN archive into a CUDA toolkit tree (roles/cudnn/tasks/unpack.yml).
# usage: copy_into_toolkit.sh STAGING INCLUDE_DIR LIB_DIR TOOLKIT_ROOT VERSION MAJOR
#   INCLUDE_DIR, LIB_DIR: the archive's folders, relative to STAGING; VERSION: X.Y.Z; MAJOR: X.
# Exit status: 0 when copied, else that of the first command that failed (set -e).
#
# NVIDIA's own steps; cp -P keeps the symlink chain that ldconfig expects. An archive repacked with the
# links as copies (tar -h, a zip round trip) gets the chain back: each libcudnn*.so.<X.Y.Z> is linked as
# .so.<X> and .so (NVIDIA cuDNN Installation Guide, "Tar File Installation"), or ldconfig refuses the
# copies. The other version's files of the same major go only after the pinned ones are in place (a
# failed copy never leaves the tree without a cuDNN); ldconfig then refreshes every process's cache.
set -e
staging=$1 include=$2 lib=$3 root=$4 version=$5 major=$6
cp -P "$staging/$include"/cudnn*.h "$root/include/"
cp -P "$staging/$lib"/libcudnn* "$root/lib64/"
cd "$root/lib64"
for full in libcudnn*.so."$version"; do
  [ -f "$full" ] || continue
  base=${full%.so."$version"}
  ln -sfn "$full" "$base.so.$major"
  ln -sfn "$base.so.$major" "$base.so"
done
chmod a+r "$root"/include/cudnn*.h "$root"/lib64/libcudnn*
find "$root/lib64/" -maxdepth 1 -name "libcudnn*.so.$major.*" ! -name "libcudnn*.so.$version" -delete
ldconfig
