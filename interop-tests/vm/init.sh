#!/bin/sh
# PID 1 of the rxe VM: mounts, loads the rdma_rxe module chain, configures eth0 from the kernel
# command line (ferroce.ip=, ferroce.ip6=, ferroce.mtu=, ferroce.name=, ferroce.share=), adds rxe0
# and hands the second serial port to the control agent. Setup failures are reported through the
# agent's READY line rather than by dying, so the harness can show why.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
export HOME=/root
bb=/bin/busybox
$bb mount -t proc proc /proc
$bb mount -t sysfs sysfs /sys
$bb mount -t devtmpfs devtmpfs /dev
$bb mkdir -p /dev/pts /dev/shm
$bb mount -t devpts devpts /dev/pts
$bb mount -t tmpfs tmpfs /run
$bb mount -t tmpfs tmpfs /tmp
$bb mount -t tmpfs tmpfs /dev/shm
$bb mount -t configfs configfs /sys/kernel/config 2>/dev/null
# Existing files (iproute2's ip/tc) win: --install does not overwrite.
$bb --install -s 2>/dev/null

status=ok
fail() {
    echo "ferroce-init: $*" >/dev/console
    [ "$status" = ok ] && status="fail: $*"
}

ip4= ip6= mtu=9000 name=rxe share=
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    ferroce.ip=*) ip4="${arg#*=}" ;;
    ferroce.ip6=*) ip6="${arg#*=}" ;;
    ferroce.mtu=*) mtu="${arg#*=}" ;;
    ferroce.name=*) name="${arg#*=}" ;;
    ferroce.share=*) share="${arg#*=}" ;;
    esac
done
hostname "$name"

for m in $(cat /etc/ferroce-modules); do
    case "$m" in
    # Refuses to load (ENODEV) on a CPU without PCLMULQDQ; crc32_generic serves rxe then.
    crc32_pclmul) insmod "/lib/modules/$m.ko" 2>/dev/null || true ;;
    *) insmod "/lib/modules/$m.ko" 2>/dev/console || fail "insmod $m" ;;
    esac
done
# The build script lists the modules in dependency order; rxe itself must be there.
[ -d /sys/module/rdma_rxe ] || fail "rdma_rxe not loaded"

/bin/ip link set lo up
/bin/ip link set eth0 mtu "$mtu" up || fail "eth0 up"
[ -n "$ip4" ] && { /bin/ip addr add "$ip4" dev eth0 || fail "ipv4 $ip4"; }
# nodad: duplicate address detection would delay the address (and its RoCE GID) by ~2 s.
[ -n "$ip6" ] && { /bin/ip -6 addr add "$ip6" dev eth0 nodad || fail "ipv6 $ip6"; }
if [ -n "$share" ]; then
    # Only a convenience: rxe works without it.
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 "$share" /mnt/host 2>/dev/console ||
        echo "ferroce-init: warning: mount 9p $share failed" >/dev/console
fi

/usr/bin/rdma link add rxe0 type rxe netdev eth0 2>/dev/console || fail "rdma link add rxe0"
port=/sys/class/infiniband/rxe0/ports/1
i=0
while [ "$i" -lt 200 ]; do
    if grep -q ACTIVE "$port/state" 2>/dev/null &&
        ! grep -q '^0000:0000:0000:0000:0000:0000:0000:0000$' "$port/gids/1" 2>/dev/null &&
        [ -e "$port/gids/1" ]; then
        break
    fi
    usleep 50000
    i=$((i + 1))
done
[ "$i" -lt 200 ] || fail "rxe0 not ACTIVE with an IPv4 GID"

echo "ferroce-init: setup $status" >/dev/console
# A shell for humans on the console (`ferroce-interop shell`); harmless when nobody is attached.
(
    while true; do
        ENV=/etc/ferroce-preamble setsid cttyhack sh -i </dev/ttyS0 >/dev/ttyS0 2>&1
        sleep 1
    done
) &
while true; do
    /usr/local/bin/ferroce-agent /dev/ttyS1 "$status"
    echo "ferroce-init: agent exited, restarting" >/dev/console
    sleep 1
done
