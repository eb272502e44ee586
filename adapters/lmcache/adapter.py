"""GdrkvConnectorAdapter: what LMCache's remote storage plugin framework
loads (remote_storage_plugin.<name>.class_name) to build GdrkvConnectors."""
from lmcache.v1.storage_backend.connector import ConnectorAdapter, extract_plugin_type

from .connector import GdrkvConnector, config_error

PLUGIN_TYPE = "gdrkv"


class GdrkvConnectorAdapter(ConnectorAdapter):
    """Serves the plugins named gdrkv or gdrkv.<instance>; each reads its
    servers from extra_config["remote_storage_plugin.<name>.url"], so
    several instances can talk to different stores at once."""

    def __init__(self):
        super().__init__("plugin://" + PLUGIN_TYPE)

    def can_parse(self, url):
        # LMCache asks every loaded adapter about every plugin: answer only
        # for gdrkv ones, never for another plugin whose name merely starts so.
        return (url.startswith("plugin://")
                and extract_plugin_type(url.removeprefix("plugin://")) == PLUGIN_TYPE)

    def create_connector(self, context):
        option = f"remote_storage_plugin.{context.plugin_name}.url"
        url = (context.config.extra_config or {}).get(option)
        if not url:
            raise config_error(f"extra_config has no {option!r}: "
                               "set it to gdrkv://host:port[,host:port...]")
        return GdrkvConnector(context.loop, context.local_cpu_backend, context.config,
                              context.metadata, url)
