"""SGLang HiCache L3 storage backend for gdrkv.

    python -m sglang.launch_server ... --enable-hierarchical-cache \
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \
        '{"backend_name": "gdrkv", "module_path": "gdrkv.adapters.sglang_hicache",
          "class_name": "GdrkvHiCacheStorage", "interface_v1": 1,
          "url": "gdrkv://10.0.0.5:7480"}'

configs/sglang/ has ready-made extra configs; docs/keys.md says how pages are
keyed.
"""
from .storage import GdrkvHiCacheStorage

__all__ = ["GdrkvHiCacheStorage"]
