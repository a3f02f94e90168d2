#!/bin/sh
# Builds a tiny OCI image archive from the static busybox, without any registry:
#   build-image.sh OUT.tar REF [CMD...]
# The root filesystem is /bin/busybox plus one symlink per applet; the image's default
# command is CMD (none: the caller gives one per container).
set -eu
out=$1; ref=$2; shift 2
busybox=${BUSYBOX:-/bin/busybox}
[ -x "$busybox" ] || { echo "no static busybox at $busybox (apt-get install busybox-static)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs/bin" "$work/rootfs/tmp" "$work/rootfs/proc" "$work/rootfs/dev" \
         "$work/rootfs/sys" "$work/rootfs/etc" "$work/layout/blobs/sha256"
cp "$busybox" "$work/rootfs/bin/busybox"
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -s busybox "$work/rootfs/bin/$applet"
done
echo 'root:x:0:0:root:/:/bin/sh' > "$work/rootfs/etc/passwd"
echo 'root:x:0:' > "$work/rootfs/etc/group"

blob() { # FILE -> digest hex; moves FILE into the blob store
  d=$(sha256sum "$1" | cut -d' ' -f1)
  mv "$1" "$work/layout/blobs/sha256/$d"
  echo "$d"
}
size() { stat -c %s "$work/layout/blobs/sha256/$1"; }

tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" -cf "$work/layer.tar" .
layer=$(blob "$work/layer.tar")

cmd=""
for a in "$@"; do
  cmd="$cmd${cmd:+,}\"$(printf '%s' "$a" | sed 's/\\/\\\\/g; s/"/\\"/g')\""
done
printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":[%s]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$cmd" "$layer" > "$work/config.json"
config=$(blob "$work/config.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
  "$config" "$(size "$config")" "$layer" "$(size "$layer")" > "$work/manifest.json"
manifest=$(blob "$work/manifest.json")

printf '{"imageLayoutVersion":"1.0.0"}' > "$work/layout/oci-layout"
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s","io.containerd.image.name":"%s"}}]}' \
  "$manifest" "$(size "$manifest")" "$ref" "$ref" > "$work/layout/index.json"
tar -C "$work/layout" -cf "$out" oci-layout index.json blobs
