"""vLLM store connector for gdrkv (vllm 0.33): GdrkvStoreConnector.

    --kv-transfer-config '{"kv_connector": "GdrkvStoreConnector",
        "kv_connector_module_path": "gdrkv.adapters.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"url": "gdrkv://10.0.0.5:7480"}}'

kv_connector_extra_config takes url (default gdrkv://local), blocks_per_key
(blocks per stored object, default 1), model (the name keys carry; default
the served model name) and any gdrkv.Client option (namespace, transport,
timeout_ms, conns, gpu_copy, token_file). configs/vllm/README.md has the rest.

The connector imports vLLM; its data movement (kv_layout, mover) and
planning (planner) do not, so they run and are tested without it.
"""


def __getattr__(name):
    # vLLM looks the class up by name on this module: import vLLM only then.
    if name == "GdrkvStoreConnector":
        from .connector import GdrkvStoreConnector
        return GdrkvStoreConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GdrkvStoreConnector"]
