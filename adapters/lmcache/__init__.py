"""LMCache remote storage plugin for gdrkv (lmcache 0.5.6).

LMCache's config (YAML, or LMCACHE_REMOTE_STORAGE_PLUGINS=gdrkv plus
LMCACHE_EXTRA_CONFIG='{...}' in the environment):

    remote_serde: naive
    remote_storage_plugins: ["gdrkv"]
    extra_config:
      remote_storage_plugin.gdrkv.module_path: gdrkv.adapters.lmcache
      remote_storage_plugin.gdrkv.class_name: GdrkvConnectorAdapter
      remote_storage_plugin.gdrkv.url: "gdrkv://10.0.0.5:7480"
      save_chunk_meta: false

The url takes gdrkv.Client's options as query parameters
(gdrkv://h1:7480,h2:7480?namespace=prod&timeout_ms=2000). Several stores at
once: plugins gdrkv.a, gdrkv.b, ... each with its own
remote_storage_plugin.gdrkv.a.* settings.

remote_url: gdrkv://host:port works too (what LMCache's basic_check
--mode test_remote uses), with the plugin declared as above but without its
url: that plugin then builds no backend of its own (LMCache logs why), so
LMCache holds one gdrkv backend
(configs/lmcache/remote-url.yaml). configs/lmcache/ has complete examples.
"""
from .adapter import GdrkvConnectorAdapter
from .connector import GdrkvConnector

__all__ = ["GdrkvConnectorAdapter", "GdrkvConnector"]
