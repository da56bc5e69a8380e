#!/bin/bash
# Builds the bcd ramdisk: a reproducible initramfs holding busybox, bcd, the kernel modules a
# server needs, /init and the udhcpc hook; and the kernel beside it.
#
#   packaging/ramdisk/build.sh --kernel-root DIR --bcd PATH --out DIR [--kernel-version V]
#                              [--busybox PATH] [--dropbear PATH] [--qemu-img PATH] [--zstd]
#
#   --kernel-root DIR     where Debian's linux-image package is unpacked (`dpkg-deb -x`, or `/` for
#                         the installed kernel): DIR/boot/vmlinuz-V and DIR/lib/modules/V with
#                         modules.dep
#   --kernel-version V    the kernel version; default: the only one under DIR/lib/modules
#   --bcd PATH            the bcd binary (a release build; its debug info is stripped)
#   --busybox PATH        a static busybox (package busybox-static), default /bin/busybox
#   --dropbear PATH       the SSH server of rescue.start (package dropbear-bin), default
#                         /usr/sbin/dropbear when it exists (else the image has no rescue);
#                         dropbearkey is taken from beside it, else from PATH
#   --qemu-img PATH       image.write's qcow2 converter (package qemu-utils; its NBD client and
#                         qcow2 driver are built in, no block module is needed), default
#                         /usr/bin/qemu-img when it exists (else the image writes raw images only)
#   --out DIR             writes DIR/initrd.img (gzip -9), DIR/vmlinuz, and with --zstd
#                         DIR/initrd.zst (the Debian kernel has RD_ZSTD)
#
# Needs: cpio, gzip, modprobe and depmod (kmod), ldd, strip (binutils); zstd for --zstd.
# Reproducible: the same inputs give the same bytes (umask 022, every mtime 0, entries sorted,
# owners 0:0, cpio --reproducible, gzip -n). Prints the sizes and the sha256 of what it wrote.
# What goes in: /bin/busybox with a link per applet, /sbin -> bin (the kernel's request_module
# runs /sbin/modprobe), /bin/bcd and the shared libraries ldd lists, /usr/sbin/dropbear and
# /usr/bin/dropbearkey with theirs, /usr/bin/qemu-img with its, /etc/passwd with root (home /root, shell /bin/sh), the
# modules of packaging/ramdisk/modules with their dependencies at their paths plus modules.order
# and modules.builtin*, depmod'ed (busybox modprobe reads modules.dep), /init, /etc/udhcpc.sh.
set -euo pipefail
umask 022
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)
kroot='' kver='' bcd='' out='' busybox=/bin/busybox dropbear='' qemuimg='' zstd=0
die() { echo "build.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --kernel-root) kroot=${2:?}; shift 2 ;;
    --kernel-version) kver=${2:?}; shift 2 ;;
    --bcd) bcd=${2:?}; shift 2 ;;
    --busybox) busybox=${2:?}; shift 2 ;;
    --dropbear) dropbear=${2:?}; shift 2 ;;
    --qemu-img) qemuimg=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --zstd) zstd=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[ -n "$kroot" ] && [ -n "$bcd" ] && [ -n "$out" ] || die "--kernel-root, --bcd and --out are required (see --help)"
if [ -z "$kver" ]; then
  # shellcheck disable=SC2012
  [ "$(ls "$kroot/lib/modules" | wc -l)" = 1 ] || die "several kernels under $kroot/lib/modules: pass --kernel-version"
  kver=$(ls "$kroot/lib/modules")
fi
mods=$kroot/lib/modules/$kver
[ -f "$kroot/boot/vmlinuz-$kver" ] || die "$kroot/boot/vmlinuz-$kver is missing"
[ -f "$mods/modules.dep" ] || die "$mods/modules.dep is missing (depmod -b $kroot $kver)"
[ -x "$bcd" ] || die "$bcd is not an executable"
[ -x "$busybox" ] || die "$busybox is missing (package busybox-static)"
if [ -z "$dropbear" ]; then
  if [ -x /usr/sbin/dropbear ]; then
    dropbear=/usr/sbin/dropbear
  else
    echo "build.sh: warning: /usr/sbin/dropbear is missing (package dropbear-bin): this ramdisk cannot serve rescue.start" >&2
  fi
fi
if [ -z "$qemuimg" ]; then
  if [ -x /usr/bin/qemu-img ]; then
    qemuimg=/usr/bin/qemu-img
  else
    echo "build.sh: warning: /usr/bin/qemu-img is missing (package qemu-utils): this ramdisk cannot write qcow2 images" >&2
  fi
fi
[ -z "$qemuimg" ] || [ -x "$qemuimg" ] || die "$qemuimg is not an executable"
dropbearkey=''
if [ -n "$dropbear" ]; then
  [ -x "$dropbear" ] || die "$dropbear is not an executable"
  dropbearkey=$(dirname "$dropbear")/dropbearkey
  [ -x "$dropbearkey" ] || dropbearkey=$(command -v dropbearkey) || die "dropbearkey is not beside $dropbear nor on PATH"
fi
for t in cpio gzip modprobe depmod ldd strip; do
  command -v "$t" >/dev/null || [ -x "/usr/sbin/$t" ] || die "$t is not installed"
done
PATH=$PATH:/usr/sbin:/sbin

started=$(date +%s.%N)
st=$(mktemp -d)
trap 'rm -rf "$st"' EXIT
chmod 755 "$st"        # mktemp's 0700 would become the mode of the ramdisk's /
mkdir -p "$st"/{bin,dev,etc,proc,sys,run,tmp,lib/modules/"$kver"}
chmod 1777 "$st/tmp"

# busybox and its applets (bcd's tools: modprobe, udhcpc, ip, poweroff)
cp "$busybox" "$st/bin/busybox"
for a in $("$st/bin/busybox" --list); do
  [ "$a" = busybox ] || ln -s busybox "$st/bin/$a"
done
ln -s bin "$st/sbin"

# bcd, stripped of debug info, and its shared libraries at the paths the loader looks at
libs() {
  ldd "$1" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i}' | sort -u | while read -r lib; do
    mkdir -p "$st$(dirname "$lib")"
    cp -L "$lib" "$st$lib"
  done
}
strip --strip-debug -o "$st/bin/bcd" "$bcd"
libs "$bcd"

# rescue.start's SSH server and its key generator, at Debian's paths (bcd's defaults)
if [ -n "$dropbear" ]; then
  mkdir -p "$st/usr/sbin" "$st/usr/bin"
  install -m 0755 "$dropbear" "$st/usr/sbin/dropbear"
  install -m 0755 "$dropbearkey" "$st/usr/bin/dropbearkey"
  libs "$dropbear"
  libs "$dropbearkey"
fi

# image.write's qcow2 converter, where bcd looks for it (PATH)
if [ -n "$qemuimg" ]; then
  mkdir -p "$st/usr/bin"
  install -m 0755 "$qemuimg" "$st/usr/bin/qemu-img"
  libs "$qemuimg"
fi

# the modules and their dependencies, then depmod for that subset
grep -v '^#' "$here/modules" | awk 'NF {print $1}' | while read -r m; do
  if ! modprobe -d "$kroot" -S "$kver" --show-depends "$m" > "$st/deps" 2> "$st/deps.err"; then
    echo "build.sh: warning: module $m is not in kernel $kver: $(cat "$st/deps.err")" >&2
  fi
  awk '$1 == "insmod" {print $2}' "$st/deps"
done | sort -u > "$st/kos"
while read -r ko; do
  rel=${ko#"$mods"/}
  mkdir -p "$st/lib/modules/$kver/$(dirname "$rel")"
  cp "$ko" "$st/lib/modules/$kver/$rel"
done < "$st/kos"
nkos=$(wc -l < "$st/kos")
rm -f "$st/deps" "$st/deps.err" "$st/kos"
for f in modules.order modules.builtin modules.builtin.modinfo; do
  [ -f "$mods/$f" ] && cp "$mods/$f" "$st/lib/modules/$kver/"
done
depmod -b "$st" "$kver"

install -m 0755 "$here/init" "$st/init"
install -m 0755 "$here/udhcpc.sh" "$st/etc/udhcpc.sh"
printf '127.0.0.1 localhost\n::1 localhost\n' > "$st/etc/hosts"
printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' > "$st/etc/nsswitch.conf"
# root, for dropbear (it looks the user up and runs its shell); no password matches "x"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$st/etc/passwd"
printf 'root:x:0:\n' > "$st/etc/group"
printf '/bin/sh\n' > "$st/etc/shells"
mkdir -m 0700 "$st/root"

# the archive: fixed mtimes, sorted names, root-owned, device-independent inode numbers
find "$st" -exec touch -h -d @0 {} +
mkdir -p "$out"
(cd "$st" && find . -print0 | sort -z | cpio --null -o -H newc --reproducible -R 0:0 --quiet) > "$out/initrd.cpio"
gzip -n -9 -c "$out/initrd.cpio" > "$out/initrd.img"
[ "$zstd" = 1 ] && zstd -q -19 -f "$out/initrd.cpio" -o "$out/initrd.zst"
cp "$kroot/boot/vmlinuz-$kver" "$out/vmlinuz"

size() { stat -c %s "$1"; }
mib() { awk -v b="$1" 'BEGIN {printf "%.2f MiB", b / 1048576}'; }
echo "kernel $kver, $nkos modules, $(cd "$st" && find . | wc -l) entries"
echo "initrd.img: $(size "$out/initrd.img") bytes ($(mib "$(size "$out/initrd.img")")) gzip, $(size "$out/initrd.cpio") bytes ($(mib "$(size "$out/initrd.cpio")")) uncompressed"
[ "$zstd" = 1 ] && echo "initrd.zst: $(size "$out/initrd.zst") bytes ($(mib "$(size "$out/initrd.zst")"))"
rm -f "$out/initrd.cpio"
(cd "$out" && sha256sum initrd.img $([ "$zstd" = 1 ] && echo initrd.zst) vmlinuz)
echo "built in $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
