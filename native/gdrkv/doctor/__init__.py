"""`gdrkv doctor` and `gdrkv stat --nic`: what this machine offers gdrkv.

report    the doctor command: system, RDMA devices, the rdma transport's view, GPUs, topology
selftest  the loopback self-test over every transport
nic       `gdrkv stat --nic`: each RDMA port's hardware counters beside the servers'

Tooling: the library modules never import it.
"""
