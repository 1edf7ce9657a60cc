"""InfiniBand and RoCE ports: types, and the sysfs observer."""
