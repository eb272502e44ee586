"""Whether this machine has a GPU gdrkv can use, and the transports the GPU
tests run over."""
from gdrkv import gpu

from support.softverbs import SOFTVERBS

GPU_OK, GPU_WHY = gpu.available()
# rdma runs over softverbs: its dma-buf MRs of GPU memory are moved with the
# CUDA driver, so the transport's GPU registration path runs end to end.
TRANSPORTS = ["shm", "tcp", "rdma"] if SOFTVERBS else ["shm", "tcp"]
