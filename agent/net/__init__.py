"""Network observation: sysfs/procfs readers, tracefs formats, the eBPF datapath, tc."""
