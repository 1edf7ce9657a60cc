"""GPUs: NVML access with bounded calls, the XID catalog, job identity from processes."""
