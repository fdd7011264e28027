#!/usr/bin/env bash
# Installs the system packages and tools the tests use. Idempotent; non-interactive.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need_apt=()
command -v tshark >/dev/null 2>&1 || need_apt+=(tshark)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v ethtool >/dev/null 2>&1 || need_apt+=(ethtool)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections || true
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
# ibverbs-compat: rdma-core's headers and libclang for bindgen; its tests run Debian's ibverbs-utils,
# rdmacm-utils and perftest against the library.
need_rdma=()
[ -f /usr/include/infiniband/verbs.h ] || need_rdma+=(libibverbs-dev)
[ -f /usr/include/rdma/rdma_cma.h ] || need_rdma+=(librdmacm-dev)
# libclang.so itself: a machine may have only libclang-cpp (another package's), which bindgen cannot use.
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || need_rdma+=(libclang-dev)
command -v ibv_rc_pingpong >/dev/null 2>&1 || need_rdma+=(ibverbs-utils)
command -v ib_write_bw >/dev/null 2>&1 || need_rdma+=(perftest)
command -v rping >/dev/null 2>&1 || need_rdma+=(rdmacm-utils)
# ... and UCX (ucx_info, ucx_perftest) and Open MPI over UCX (mpirun, mpicc) over it.
command -v ucx_perftest >/dev/null 2>&1 || need_rdma+=(ucx-utils)
command -v mpirun >/dev/null 2>&1 || need_rdma+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || need_rdma+=(libopenmpi-dev)
# collectives' rdma-core feature (sideway's rdma-mummy-sys builds its shim with cmake); its tests
# build it on demand.
command -v cmake >/dev/null 2>&1 || need_rdma+=(cmake)
if [ "${#need_rdma[@]}" -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_rdma[@]}"
fi
# (A Debian-managed python3 refuses plain pip installs: PEP 668.)
python3 -c 'import scapy.contrib.roce' 2>/dev/null || python3 -m pip install -q scapy ||
    python3 -m pip install -q --break-system-packages scapy
# fuzz/run-all.sh (called by .ci/run) needs cargo-fuzz; it fuzzes on stable with -s none.
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
# nic-drivers netns tests ping across namespaces.
command -v ping >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends iputils-ping; }

# rxe VM for interop-tests: QEMU and tcpdump on the host. The VM's kernel and user side come from
# Debian packages unpacked (never installed) into target/rxe-vm by the repo's build script.
need_vm=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_vm+=(qemu-system-x86)
command -v tcpdump >/dev/null 2>&1 || need_vm+=(tcpdump)
if [ "${#need_vm[@]}" -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_vm[@]}"
fi
if [ "$(id -u)" = 0 ]; then
    # Idempotent (a stamp); on failure the VM tests skip with the reason rather than fail CI here.
    bash "$(dirname "$0")/../interop-tests/vm/build-image.sh" ||
        echo "install-deps: rxe VM image build failed; interop VM tests will skip" >&2
fi
