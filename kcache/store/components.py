"""The files of a kernel entry. Here, not in kcache.tilelang, so that tools (the CLI, gc,
eviction) know an entry without importing TileLang."""

DEVICE_SOURCE = "device.cu"
HOST_SOURCE = "host.cu"
DEVICE_BINARY = "kernel.cubin"
LIBRARY = "kernel.so"
PARAMS = "params.json"
META = "meta.json"
COMPONENTS = frozenset({DEVICE_SOURCE, HOST_SOURCE, DEVICE_BINARY, LIBRARY, PARAMS, META})
KERNELS = "kernels"  # the namespace (directory under the root) of kernel entries
