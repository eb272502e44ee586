"""GdrkvConnectorAdapter: what LMCache's remote storage plugin framework
loads (remote_storage_plugin.<name>.class_name) to build GdrkvConnectors."""
from lmcache.logging import init_logger
from lmcache.v1.storage_backend.connector import ConnectorAdapter, extract_plugin_type
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

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
    builds a backend for the plugin as well as for remote_url): a plugin
    instance with no url of its own then stays idle, so nothing is written
    twice."""

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
            logger.info("gdrkv: remote_url %s is the store; plugin %s, which names no url "
                        "of its own, stays idle", config.remote_url, context.plugin_name)
            return IdleConnector(config, context.metadata)
        if not url:
            raise config_error(f"extra_config has no {option!r}: "
                               "set it to gdrkv://host:port[,host:port...] or "
                               "gdrkv+etcd://etcd:2379[,...]/CLUSTER")
        return GdrkvConnector(context.loop, context.local_cpu_backend, config,
                              context.metadata, url)


class IdleConnector(RemoteConnector):
    """The backend LMCache builds for a gdrkv plugin declared only so that
    remote_url: gdrkv://... can be parsed: it holds nothing and stores
    nothing (the remote_url backend does both)."""

    async def exists(self, key):
        return False

    def exists_sync(self, key):
        return False

    async def get(self, key):
        return None

    async def put(self, key, memory_obj):
        return None

    async def list(self):
        return []

    async def close(self):
        return None
