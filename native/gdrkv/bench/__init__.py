"""`gdrkv bench`: throughput against the ceilings and the peers.

command  the command's arguments and the dispatch to a mode
harness  timed rounds, medians, touched buffers, the TCP and memcpy ceilings, a server process
plain    gdrkv's own put/get/exists rows
compare  --compare: every transport, the peers and the engines on one workload
peers    Mooncake Store and Redis, started and driven for --compare
engines  SGLang's and LMCache's storage interfaces, gdrkv against their own backends
gpu      --gpu: host<->GPU ceilings, gdrkv into GPU memory, interference
vllm     --vllm: the vLLM connector's save and load of GPU KV
restart  --restart: a server's restart on a full pool file
plot     the --compare PNG

Tooling: the library modules never import it.
"""
