/* The ABI this library implements: Debian's rdma-core headers (libibverbs-dev, librdmacm-dev). */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
