#!/usr/bin/env bash
# Builds the rxe VM image cache: Debian's stock kernel (vmlinuz + uncompressed vmlinux) and an
# initramfs with busybox, the rdma_rxe module chain, iproute2, rdma-core's user side, perftest and
# tcpdump. Packages come from the host's apt sources (`apt-get download` + `dpkg -x`); nothing is
# installed into the host. Idempotent: exits at once when the stamp matches.
#
# Usage: build-image.sh [--force]
# Cache: $FERROCE_RXE_VM_CACHE, else <workspace>/target/rxe-vm.
set -euo pipefail

# Bump when the image's contents or layout change: the Rust harness checks the same string.
IMAGE_VERSION="ferroce-rxe-vm-4"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
workspace="$(cd "$here/../.." && pwd)"
cache="${FERROCE_RXE_VM_CACHE:-$workspace/target/rxe-vm}"
force=0
[ "${1:-}" = "--force" ] && force=1
# The image embeds these scripts, so their contents are part of the cache key.
key="$IMAGE_VERSION $(cat "$here/build-image.sh" "$here/init.sh" "$here/agent.sh" | sha256sum | cut -c1-16)"

mkdir -p "$cache"
# Tests running in parallel may all ask for the image; one builds, the others wait.
exec 9>"$cache/.lock"
flock 9

is_complete() {
    [ -f "$cache/stamp" ] && [ "$(head -n1 "$cache/stamp")" = "$key" ] &&
        [ -f "$cache/initramfs.cpio" ] && [ -f "$cache/vmlinuz" ]
}
if [ "$force" = 0 ] && is_complete; then
    echo "rxe-vm: cache complete at $cache ($(sed -n 2p "$cache/stamp"))"
    exit 0
fi

log() { echo "rxe-vm: $*" >&2; }
die() { echo "rxe-vm: error: $*" >&2; exit 1; }
for tool in apt-get apt-cache dpkg dpkg-deb xz flock; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (this script needs a Debian host)"
done

export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_update_once() {
    if [ "$apt_updated" = 0 ]; then
        log "apt-get update"
        apt-get update -qq >&2 || die "apt-get update failed"
        apt_updated=1
    fi
}

# The concrete kernel package behind the linux-image-amd64 meta package.
kernel_pkg() {
    apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1
}
kpkg="$(kernel_pkg)"
if [ -z "$kpkg" ]; then
    apt_update_once
    kpkg="$(kernel_pkg)"
fi
[ -n "$kpkg" ] || die "cannot resolve linux-image-amd64 (no Debian apt sources?)"

roots=(busybox-static iproute2 libibverbs1 ibverbs-providers ibverbs-utils perftest
    librdmacm1 rdmacm-utils libibumad3 libpci3 tcpdump)

# Closure of the roots over Depends/Pre-Depends, following only library packages: the image needs
# shared objects, not the maintainer-script machinery (debconf, adduser, ...). Of alternatives
# ("A | B") the first is taken. One apt-cache call per level of the tree (each call reads the whole
# package cache, ~1.3 s here; one per package made this most of the build).
closure() {
    local -A seen=()
    local level=() next pkg line dep skip_next
    for pkg in "$@"; do
        [ -n "${seen[$pkg]:-}" ] && continue
        seen[$pkg]=1
        level+=("$pkg")
    done
    while [ "${#level[@]}" -gt 0 ]; do
        printf '%s\n' "${level[@]}"
        next=()
        skip_next=0
        while IFS= read -r line; do
            case "$line" in
            " |Depends: "* | " |PreDepends: "*)
                dep="${line#*: }"
                skip_next=1
                ;;
            "  Depends: "* | "  PreDepends: "*)
                dep="${line#*: }"
                if [ "$skip_next" = 1 ]; then
                    skip_next=0
                    continue
                fi
                ;;
            " "*) continue ;;
            # A package's own line starts its block.
            *)
                skip_next=0
                continue
                ;;
            esac
            case "$dep" in
            "<"*) continue ;;
            lib* | zlib*)
                if [ -z "${seen[$dep]:-}" ]; then
                    seen[$dep]=1
                    next+=("$dep")
                fi
                ;;
            esac
        done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
            --no-replaces --no-enhances "${level[@]}" 2>/dev/null)
        level=("${next[@]}")
    done
}
mapfile -t pkgs < <(closure "${roots[@]}")
[ "${#pkgs[@]}" -gt "${#roots[@]}" ] || die "package closure looks wrong: ${pkgs[*]}"

debs="$cache/debs"
# Fresh each build: with only this build's downloads present, "the .deb of package X" is unique.
rm -rf "$debs"
mkdir -p "$debs"
download() {
    (cd "$debs" && apt-get download -q "$@" >&2 2>/dev/null) || return 1
}
log "downloading ${#pkgs[@]} packages + $kpkg into $debs"
if ! download "$kpkg" "${pkgs[@]}"; then
    apt_update_once
    download "$kpkg" "${pkgs[@]}" || die "apt-get download failed"
fi

work="$cache/build.tmp"
rm -rf "$work"
mkdir -p "$work/kernel" "$work/root"

# --- kernel --------------------------------------------------------------------------------------
kdeb="$(ls "$debs"/"${kpkg}"_*.deb | sort | tail -n1)"
dpkg -x "$kdeb" "$work/kernel"
kver="$(ls "$work/kernel/lib/modules" | head -n1)"
[ -n "$kver" ] || die "no modules in $kdeb"
cp "$work/kernel/boot/vmlinuz-$kver" "$work/vmlinuz"

# The uncompressed ELF boots through QEMU's PVH entry and skips the in-guest decompression
# (~4 s under TCG). Same idea as the kernel's scripts/extract-vmlinux: find the compressed
# payload's magic and decompress from there. Debian's kernel is xz-compressed.
extract_vmlinux() {
    local img="$1" out="$2" off
    for off in $(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$img" | cut -d: -f1); do
        if tail -c +"$((off + 1))" "$img" | xz -dc --single-stream >"$out" 2>/dev/null ||
            [ -s "$out" ]; then
            if [ "$(head -c 4 "$out" | od -An -tx1 | tr -d ' \n')" = "7f454c46" ]; then
                return 0
            fi
        fi
    done
    rm -f "$out"
    return 1
}
if extract_vmlinux "$work/vmlinuz" "$work/vmlinux"; then
    log "extracted vmlinux ($(du -h "$work/vmlinux" | cut -f1))"
else
    log "could not extract vmlinux; the harness will boot vmlinuz"
fi

# --- user side -----------------------------------------------------------------------------------
root="$work/root"
for pkg in "${pkgs[@]}"; do
    deb="$(ls "$debs"/"${pkg}"_*.deb 2>/dev/null | sort | tail -n1)"
    [ -n "$deb" ] || die "missing download for $pkg"
    dpkg -x "$deb" "$root"
done
rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,bug,bash-completion,zsh} "$root"/usr/include \
    "$root"/usr/lib/x86_64-linux-gnu/gconv
find "$root" -name "*.a" -delete

mkdir -p "$root"/{proc,sys,dev,run,tmp,mnt/host,root,etc,usr/local/bin}
# Shared objects: the loader searches these through ld.so.cache normally; the image has none, so
# init exports LD_LIBRARY_PATH and we check resolution here with the image's own loader.
ldpath="/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu"
loader="$root/lib64/ld-linux-x86-64.so.2"
[ -e "$loader" ] || die "no dynamic loader in the image"
hostldpath="$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu"
tools=(bin/ip sbin/tc usr/bin/rdma usr/bin/ibv_devinfo usr/bin/ibv_rc_pingpong usr/bin/ibv_uc_pingpong
    usr/bin/ibv_ud_pingpong usr/bin/ibv_srq_pingpong usr/bin/ib_write_bw usr/bin/ib_read_bw
    usr/bin/ib_send_bw usr/bin/ib_atomic_bw usr/bin/ib_write_lat usr/bin/ib_read_lat
    usr/bin/ib_send_lat usr/bin/rping usr/bin/ucmatose usr/bin/udaddy usr/bin/tcpdump)
for t in "${tools[@]}"; do
    f="$root/$t"
    [ -e "$f" ] || f="$root/usr/$t"
    [ -e "$f" ] || f="$root/usr/sbin/$(basename "$t")"
    [ -e "$f" ] || die "tool $t missing from the image"
    # Every library must come from the image: the loader falls back to the host's own paths, so
    # a library found outside $root is one the image lacks.
    listing="$("$loader" --library-path "$hostldpath" --list "$f" 2>&1 || true)"
    if echo "$listing" | grep -q 'not found' ||
        echo "$listing" | grep '=> /' | grep -vq "=> $root/"; then
        echo "$listing" >&2
        die "shared libraries of $t missing from the image"
    fi
done
[ -d "$root/etc/libibverbs.d" ] || die "no /etc/libibverbs.d (ibverbs-providers)"
ls "$root"/usr/lib/x86_64-linux-gnu/libibverbs/librxe* >/dev/null 2>&1 || die "no librxe provider"

# busybox: the shell is needed before init can run `busybox --install`.
ln -sf busybox "$root/bin/sh"

# --- kernel modules ------------------------------------------------------------------------------
moddir="$work/kernel/lib/modules/$kver"
# Newer Debian kernels ship compressed modules; busybox insmod wants them plain.
while IFS= read -r f; do
    case "$f" in
    *.ko.xz) xz -d "$f" ;;
    *.ko.zst) zstd -q -d --rm "$f" || die "zstd needed for $f" ;;
    *.ko.gz) gzip -d "$f" ;;
    esac
done < <(find "$moddir" -name '*.ko.xz' -o -name '*.ko.zst' -o -name '*.ko.gz')
declare -A modpath=()
while IFS= read -r f; do
    b="${f##*/}"
    b="${b%.ko}"
    modpath[$b]="$f"
    modpath[${b//-/_}]="$f"
done < <(find "$moddir" -name '*.ko')
declare -A emitted=()
order=()
# emit MODULE [optional]: MODULE after its dependencies (modinfo's depends=, read from the .ko).
emit() {
    local m="${1//-/_}" f deps d
    [ -n "${emitted[$m]:-}" ] && return 0
    f="${modpath[$m]:-}"
    # Built into the kernel: nothing to load.
    if [ -z "$f" ]; then
        grep -q "/$m.ko\$" "$moddir/modules.builtin" 2>/dev/null && return 0
        grep -q "/${1}.ko\$" "$moddir/modules.builtin" 2>/dev/null && return 0
        [ "${2:-}" = optional ] && { log "module $1 not found, skipped"; return 0; }
        die "module $1 neither in the package nor built in"
    fi
    emitted[$m]=1
    deps="$(tr '\0' '\n' <"$f" | sed -n 's/^depends=//p' | head -n1)"
    for d in ${deps//,/ }; do emit "$d"; done
    order+=("$m")
}
# crc32_generic is not a declared dependency but rxe (6.1) asks the crypto API for crc32 at link
# time; without it `rdma link add` fails. virtio_ring before virtio per the shared notes.
for m in crc32_generic virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev; do
    emit "$m" optional
done
for m in virtio_pci failover net_failover virtio_net udp_tunnel ip6_udp_tunnel ib_core ib_uverbs \
    rdma_rxe; do
    emit "$m"
done
# rxe's ICRC goes through the crypto API's "crc32"; with a CPU model that has PCLMULQDQ (`--cpu
# max`) crc32-pclmul serves it, as on a real host, so rxe and ferroce (crc32fast) both use the CPU's
# carry-less multiply. init.sh tolerates its refusal on CPUs without it (qemu64).
emit crc32_pclmul optional
# Useful extras (rdma_cm tools, netem, the 9p share, veth for namespace hosts inside a VM): their
# absence does not stop rxe.
for m in ib_umad configfs ib_cm iw_cm rdma_cm rdma_ucm sch_netem netfs fscache 9pnet 9pnet_virtio 9p \
    veth; do
    emit "$m" optional
done
mkdir -p "$root/lib/modules"
: >"$root/etc/ferroce-modules"
for m in "${order[@]}"; do
    cp "${modpath[$m]}" "$root/lib/modules/$m.ko"
    echo "$m" >>"$root/etc/ferroce-modules"
done
log "modules: ${order[*]}"

# --- init and agent ------------------------------------------------------------------------------
install -m 0755 "$here/init.sh" "$root/init"
install -m 0755 "$here/agent.sh" "$root/usr/local/bin/ferroce-agent"
echo "$key" >"$root/etc/ferroce-image"
# Sourced before every job: busybox's standalone shell would run its own applets for these names
# before searching PATH; functions come first.
cat >"$root/etc/ferroce-preamble" <<'PRE'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
export HOME=/root
ip() { /bin/ip "$@"; }
tc() { /sbin/tc "$@"; }
bridge() { /sbin/bridge "$@"; }
cd /tmp
PRE

# Uncompressed: the kernel unpacks it faster than it decompresses gzip under TCG.
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | "$root/bin/busybox" cpio -o -H newc -R 0:0 2>/dev/null) \
    >"$work/initramfs.cpio"
[ -s "$work/initramfs.cpio" ] || die "cpio failed"

# --- publish -------------------------------------------------------------------------------------
mv -f "$work/vmlinuz" "$cache/vmlinuz"
if [ -f "$work/vmlinux" ]; then mv -f "$work/vmlinux" "$cache/vmlinux"; else rm -f "$cache/vmlinux"; fi
mv -f "$work/initramfs.cpio" "$cache/initramfs.cpio"
echo "$kver" >"$cache/kernel-version"
# What went in, for reproducing a given image.
(cd "$debs" && ls *.deb) >"$cache/packages.txt"
rm -rf "$work"
{
    echo "$key"
    echo "kernel=$kver packages=${#pkgs[@]} built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$cache/stamp"
log "done: $cache ($(du -sh "$cache/initramfs.cpio" | cut -f1) initramfs)"
