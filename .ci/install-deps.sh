#!/usr/bin/env bash
# Installs the system packages and tools the tests use. Idempotent; non-interactive.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
# cargo-fuzz (fuzz/run-all.sh, called by .ci/run, fuzzes on stable with -s none) compiles for about
# a minute: build it while apt downloads and unpacks.
fuzz_pid=
fuzz_log="$(mktemp)"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked >"$fuzz_log" 2>&1 &
    fuzz_pid=$!
fi

# Every missing Debian package, installed by one apt-get run.
need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
# nic-drivers netns tests ping across namespaces.
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
# ibverbs-compat: rdma-core's headers and libclang for bindgen; its tests run Debian's ibverbs-utils,
# rdmacm-utils and perftest against the library.
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -f /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
# libclang.so itself: a machine may have only libclang-cpp (another package's), which bindgen cannot use.
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || need+=(libclang-dev)
command -v ibv_rc_pingpong >/dev/null 2>&1 || need+=(ibverbs-utils)
command -v ib_write_bw >/dev/null 2>&1 || need+=(perftest)
command -v rping >/dev/null 2>&1 || need+=(rdmacm-utils)
# ... and UCX (ucx_info, ucx_perftest) and Open MPI over UCX (mpirun, mpicc) over it.
command -v ucx_perftest >/dev/null 2>&1 || need+=(ucx-utils)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
# collectives' rdma-core feature (sideway's rdma-mummy-sys builds its shim with cmake); its tests
# build it on demand.
command -v cmake >/dev/null 2>&1 || need+=(cmake)
# rxe VM for interop-tests: QEMU and tcpdump on the host. The VM's kernel and user side come from
# Debian packages unpacked (never installed) into target/rxe-vm by the repo's build script.
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
if [ "${#need[@]}" -gt 0 ]; then
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections || true
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
# (A Debian-managed python3 refuses plain pip installs: PEP 668.)
python3 -c 'import scapy.contrib.roce' 2>/dev/null || python3 -m pip install -q scapy ||
    python3 -m pip install -q --break-system-packages scapy

if [ "$(id -u)" = 0 ]; then
    # Idempotent (a stamp); on failure the VM tests skip with the reason rather than fail CI here.
    bash "$(dirname "$0")/../interop-tests/vm/build-image.sh" ||
        echo "install-deps: rxe VM image build failed; interop VM tests will skip" >&2
fi
if [ -n "$fuzz_pid" ] && ! wait "$fuzz_pid"; then
    cat "$fuzz_log" >&2
    echo "install-deps: cargo install cargo-fuzz failed" >&2
    exit 1
fi
rm -f "$fuzz_log"
