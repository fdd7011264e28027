/* The ABI this library implements: Debian's rdma-core headers. */
#include <infiniband/verbs.h>
