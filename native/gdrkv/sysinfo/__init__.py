"""What the host has, read from /sys and /proc (honouring $GDRKV_SYSFS_ROOT)
and from the CUDA driver: used by doctor and bench, never by the library.

fs    reading /sys and /proc under $GDRKV_SYSFS_ROOT
host  the CPU model
pci   PCIe distance between two devices (PIX/PXB/PHB/NODE/SYS)
rdma  RDMA devices, ports, GIDs and hardware counters
gpu   GPUs: CUDA attributes, BAR1, nvidia-peermem
"""
