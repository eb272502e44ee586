"""Runs in the vLLM environment (tests/support/vllm_env.py): checks the
`vllm serve` command lines and LMCache settings that doc snippets recorded
(tests/tools/test_snippets.py) with vLLM's and LMCache's own parsers, and
gdrkv's adapters' own reading of them.

One request per stdin line, JSON: {"argv": [...] (after "vllm"), "env":
{...}, "cwd": DIR} or {"lmcache_env": {...}, "cwd": DIR}; one answer per
stdout line, JSON: {"error": None or text, "checked": [what was checked]}.
Imports are paid once, for every snippet of a test run."""
import contextlib
import importlib
import io
import json
import logging
import os
import sys
import traceback
from types import SimpleNamespace


def main():
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                       # libraries' prints must not garble the answers
    for line in sys.stdin:
        request = json.loads(line)
        checked = []
        try:
            os.chdir(request["cwd"])
            if "argv" in request:
                check_vllm(request["argv"], request["env"], checked)
            else:
                with environment(request["lmcache_env"]):
                    check_lmcache(None, checked, hashing=False)
            error = None
        except Exception:
            error = traceback.format_exc(limit=3)
        print(json.dumps({"error": error, "checked": checked}), file=answers, flush=True)


@contextlib.contextmanager
def environment(variables):
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def check_vllm(argv, env, checked):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # `vllm serve MODEL ...`: the serve command's engine arguments (its
    # server-only flags need uvicorn, which the test environment lacks).
    assert argv[:1] == ["serve"] and not argv[1].startswith("-"), argv
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="vllm serve"))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args = parser.parse_args(["--model", argv[1], *argv[2:]])
        except SystemExit:
            raise ValueError(f"vllm serve: {stderr.getvalue()[-1000:]}") from None
    checked.append("EngineArgs")
    transfer = args.kv_transfer_config
    if transfer is None:
        return
    checked.append("KVTransferConfig")
    if transfer.kv_connector_module_path:
        module = importlib.import_module(transfer.kv_connector_module_path)
        getattr(module, transfer.kv_connector)
    else:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        assert transfer.kv_connector in KVConnectorFactory._registry, transfer.kv_connector
    checked.append(transfer.kv_connector)
    with environment(env):
        if transfer.kv_connector == "GdrkvStoreConnector":
            check_gdrkv_connector(args, transfer, checked)
        elif transfer.kv_connector == "LMCacheConnectorV1":
            assert "LMCACHE_CONFIG_FILE" in os.environ, "LMCacheConnectorV1 without a config"
            check_lmcache(os.environ["LMCACHE_CONFIG_FILE"], checked)


def check_gdrkv_connector(args, transfer, checked):
    from gdrkv.adapters.vllm.connector import check_hashing, parse_options
    from gdrkv.client import _parse_url, _resolve_options

    config = SimpleNamespace(
        kv_transfer_config=transfer,
        model_config=SimpleNamespace(served_model_name=args.served_model_name, model=args.model),
        cache_config=SimpleNamespace(prefix_caching_hash_algo=args.prefix_caching_hash_algo))
    options = parse_options(config)
    check_hashing(config)
    if not options.url.startswith("gdrkv://local"):     # that one starts a daemon
        _parse_url(options.url)
    _resolve_options(options.client_options)
    checked.append("gdrkv connector options")


class _Unknown(logging.Handler):
    """LMCache only warns about a key it does not know: here it is an error."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        if "Unknown configuration key" in record.getMessage():
            self.messages.append(record.getMessage())


def check_lmcache(path, checked, hashing=True):
    """LMCache's loader on a config file (or, path None, its environment
    form), then what it would load: each plugin's adapter class, every gdrkv
    url, and (hashing) gdrkv's guard on deterministic chunk hashes, in the
    environment vLLM would start in."""
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.storage_backend.connector import ConnectorAdapter
    from gdrkv.adapters.lmcache.chunk_keys import require_deterministic_hashing
    from gdrkv.client import _parse_url, _resolve_options

    unknown = _Unknown()
    logging.getLogger().addHandler(unknown)
    for name in logging.root.manager.loggerDict:
        if name.startswith("lmcache"):
            logging.getLogger(name).addHandler(unknown)
    config = LMCacheEngineConfig.from_file(path) if path else LMCacheEngineConfig.from_env()
    assert not unknown.messages, unknown.messages
    checked.append("LMCacheEngineConfig")
    extra = config.extra_config or {}
    urls = [config.remote_url] if (config.remote_url or "").startswith("gdrkv://") else []
    for plugin in config.remote_storage_plugins or []:
        prefix = f"remote_storage_plugin.{plugin}."
        module = importlib.import_module(extra[prefix + "module_path"])
        assert issubclass(getattr(module, extra[prefix + "class_name"]), ConnectorAdapter)
        urls += [extra[prefix + "url"]] if prefix + "url" in extra else []
    assert urls, "no gdrkv url"
    for url in urls:
        _resolve_options(_parse_url(url)[1])
    checked.append("gdrkv plugin")
    if hashing:
        require_deterministic_hashing(config.pre_caching_hash_algorithm)
        checked.append("deterministic hashing")


if __name__ == "__main__":
    main()
