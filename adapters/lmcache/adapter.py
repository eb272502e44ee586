"""GdrkvConnectorAdapter: what LMCache's remote storage plugin framework
loads (remote_storage_plugin.<name>.class_name) to build GdrkvConnectors."""
from lmcache.logging import init_logger
from lmcache.v1.storage_backend.connector import ConnectorAdapter, extract_plugin_type

from .connector import GdrkvConnector, config_error

PLUGIN_TYPE = "gdrkv"
# A list of servers, or a cluster whose members are in etcd.
URL_SCHEMES = ("gdrkv://", "gdrkv+etcd://")

logger = init_logger(__name__)


class GdrkvConnectorAdapter(ConnectorAdapter):
    """Serves the plugins named gdrkv or gdrkv.<instance>; each reads its
    servers from extra_config["remote_storage_plugin.<name>.url"], so
    several instances can talk to different stores at once.

    Also serves remote_url: gdrkv://... once a gdrkv plugin is declared
    (LMCache 0.5.6 loads out-of-tree adapters through plugins alone, and
    tries to build a backend for the plugin as well as for remote_url): a
    plugin instance with no url of its own refuses to be built, so LMCache's
    backends hold one gdrkv backend, and nothing can write into one that
    stores nothing."""

    def __init__(self):
        super().__init__("plugin://" + PLUGIN_TYPE)

    def can_parse(self, url):
        # LMCache asks every loaded adapter about every plugin: answer only
        # for gdrkv ones, never for another plugin whose name merely starts so.
        if url.startswith(URL_SCHEMES):
            return True
        return (url.startswith("plugin://")
                and extract_plugin_type(url.removeprefix("plugin://")) == PLUGIN_TYPE)

    def create_connector(self, context):
        config = context.config
        if context.url.startswith(URL_SCHEMES):
            return GdrkvConnector(context.loop, context.local_cpu_backend, config,
                                  context.metadata, context.url)
        option = f"remote_storage_plugin.{context.plugin_name}.url"
        url = (config.extra_config or {}).get(option)
        if not url and (config.remote_url or "").startswith(URL_SCHEMES):
            # LMCache logs this as "Failed to create remote backend for plugin
            # gdrkv" and goes on without it: the one way it offers to not
            # build a backend.
            raise config_error(f"plugin {context.plugin_name} names no url of its own: "
                               f"remote_url {config.remote_url} is the store, and this plugin "
                               "builds no second backend (configs/lmcache/remote-url.yaml)")
        if not url:
            raise config_error(f"extra_config has no {option!r}: "
                               "set it to gdrkv://host:port[,host:port...] or "
                               "gdrkv+etcd://etcd:2379[,...]/CLUSTER")
        return GdrkvConnector(context.loop, context.local_cpu_backend, config,
                              context.metadata, url)
