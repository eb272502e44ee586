"""The gdrkv settings in SGLang's --hicache-storage-backend-extra-config."""
from dataclasses import dataclass
from typing import Optional

# Keys SGLang's dynamic backend factory reads from the same dictionary.
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")
# Keys this adapter reads; every other key is a gdrkv.Client option (namespace,
# timeout_ms, conns, transport, ...), which the client validates.
ADAPTER_KEYS = ("url", "embedded_memory", "kv_cache_dtype")
EMBEDDED_MEMORY = "1GiB"


@dataclass(frozen=True)
class Options:
    url: Optional[str]                  # None: start an embedded server
    embedded_memory: str
    kv_cache_dtype: Optional[str]       # overrides the host pool's dtype in keys
    zero_copy: bool                     # SGLang calls the v1 methods ("interface_v1")
    client_options: dict


def parse_extra_config(extra_config):
    config = dict(extra_config or {})
    zero_copy = bool(config.get("interface_v1", 0))
    for key in SGLANG_KEYS:
        config.pop(key, None)
    url = config.pop("url", None)
    if url is not None and "embedded_memory" in config:
        raise ValueError("gdrkv extra config: embedded_memory applies only without url")
    return Options(url=url, embedded_memory=config.pop("embedded_memory", EMBEDDED_MEMORY),
                   kv_cache_dtype=config.pop("kv_cache_dtype", None), zero_copy=zero_copy,
                   client_options=config)
