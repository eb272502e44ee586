"""Store keys for engine pages and chunks: the one place adapters build them.

A key is a pure function of what decides the bytes of an object, followed by
the engine's content hash:

    sglang/Llama-3.1-8B-Instruct~08a20b291e44/bf16/page_first/p64/2x524288/tp0of2/pp0of1/<hash>

engine, model (readable name ~ digest of the full identity), KV dtype,
layout, tokens per page or chunk, segments x bytes per segment, then the
parallel coordinates that change the bytes (tensor, pipeline and context
parallel rank "of" size; absent where the object is the same on every rank,
as for MLA). Two writers whose bytes could differ never share a key, so a
reader with another geometry misses instead of reading wrong bytes.

Nothing here depends on the process: no hash(), no randomness, no DP rank
(data-parallel replicas hold the same bytes and must share them). The gdrkv
namespace (Client option) is not part of the key: the server keeps each
namespace's keys apart. docs/keys.md has the full scheme.
"""
import hashlib
import re
from urllib.parse import parse_qsl

# Longest readable model name kept in a key; the digest covers the rest.
_MODEL_NAME_CHARS = 48
_MODEL_DIGEST_CHARS = 12
# Longest content hash accepted: keeps every key far below the protocol's
# 4096-byte limit (a prefix is at most a few hundred bytes).
_MAX_HASH_BYTES = 1024

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")

# torch and engine spellings of a KV dtype -> the one name keys use. The fp8
# formats stay apart: same width, different bits.
_DTYPE_NAMES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "float64": "fp64",
    "double": "fp64",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fnuz": "fp8_e4m3fnuz",
    "float8_e5m2": "fp8_e5m2",
    "float8_e5m2fnuz": "fp8_e5m2fnuz",
    "float4_e2m1fn_x2": "fp4_e2m1",
    "float8_e8m0fnu": "fp8_e8m0",
    "uint8": "u8",
    "int8": "i8",
}

# The KV dtypes keys may name, by canonical name, and the bytes one element
# takes in an engine's buffer: packed fp4 (two per byte) and every fp8 live
# in uint8 buffers, one byte per stored unit.
DTYPE_BYTES = {
    "fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2,
    "fp8_e4m3": 1, "fp8_e4m3fnuz": 1, "fp8_e5m2": 1, "fp8_e5m2fnuz": 1, "fp8_e8m0": 1,
    "fp4_e2m1": 1, "u8": 1, "i8": 1,
}


class KeyScheme:
    """Builds the keys of one engine's objects of one geometry.

    Keyword arguments: engine ("sglang", "lmcache"), model (any string),
    dtype (str or torch.dtype), layout (engine layout name), page_tokens,
    segments and segment_bytes (an int for equal segments, or one int per
    segment), the rank/size pairs tp, pp, cp and dcp (None, None where the
    object does not depend on that rank), and logical_page_tokens where a
    page is a shard of a larger logical page (SGLang's decode context
    parallelism). Raises ValueError on bad fields.
    """

    def __init__(self, *, engine, model, dtype, layout, page_tokens, segments, segment_bytes,
                 tp_rank=None, tp_size=None, pp_rank=None, pp_size=None,
                 cp_rank=None, cp_size=None, dcp_rank=None, dcp_size=None,
                 logical_page_tokens=None):
        parts = [
            _name("engine", engine),
            _model(model),
            dtype_name(dtype),
            _name("layout", layout),
            f"p{_positive('page_tokens', page_tokens)}",
            _geometry(segments, segment_bytes),
        ]
        if logical_page_tokens is not None:
            parts.append(f"lp{_positive('logical_page_tokens', logical_page_tokens)}")
        for axis, rank, size in (("tp", tp_rank, tp_size), ("pp", pp_rank, pp_size),
                                 ("cp", cp_rank, cp_size), ("dcp", dcp_rank, dcp_size)):
            coordinate = _coordinate(axis, rank, size)
            if coordinate:
                parts.append(coordinate)
        self._prefix = "/".join(parts) + "/"

    def prefix(self):
        """Everything but the content hash, ending in "/"."""
        return self._prefix

    def key(self, content_hash):
        """prefix() + the content hash: a str as given, bytes as hex, an int
        as (signed) hex."""
        return self._prefix + _hash_text(content_hash)

    def keys(self, hashes):
        return [self._prefix + _hash_text(h) for h in hashes]

    def __repr__(self):
        return f"KeyScheme({self._prefix!r})"


def engine_namespace(engine, model):
    """The namespace an engine adapter uses unless told another one: the
    engine and the model as keys name them ("sglang/Llama-3.1-8B~<12 hex>"),
    so that engines never share objects by accident and an engine's clear()
    (SGLang's flush) empties its own objects of that model only. Engines
    meant to share set the same namespace explicitly. Without a model
    name, the engine alone."""
    engine = _name("engine", engine)
    return f"{engine}/{_model(model)}" if model else engine


def with_engine_namespace(url, options, engine, model):
    """options, plus namespace=engine_namespace(engine, model) unless the
    options or url's query already set one (even to "")."""
    if "namespace" in options or "namespace" in url_query(url or ""):
        return dict(options)
    return {**options, "namespace": engine_namespace(engine, model)}


def url_query(url):
    """The options in a gdrkv:// URL's query string, {name: text}; nothing
    else of the URL is looked at."""
    query = url.partition("?")[2]
    return dict(parse_qsl(query, keep_blank_values=True))


def _model(model):
    """A model identity as a short readable name plus a digest of all of it:
    "meta-llama/Llama-3.1-8B-Instruct" -> "Llama-3.1-8B-Instruct~<12 hex>"."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model must be a non-empty string, not {model!r}")
    last = model.rstrip("/").rsplit("/", 1)[-1]
    readable = _UNSAFE.sub("_", last).strip("_")[:_MODEL_NAME_CHARS] or "model"
    digest = hashlib.sha256(model.encode()).hexdigest()[:_MODEL_DIGEST_CHARS]
    return f"{readable}~{digest}"


def dtype_name(dtype):
    """The canonical name of a KV dtype: torch.bfloat16, "bfloat16" and
    "bf16" are all "bf16"; float8_e4m3fn is "fp8_e4m3". Anything that names
    no dtype of DTYPE_BYTES ("auto", a typo like "fp8_e4m4") is refused:
    it would become part of every key and silently miss."""
    text = str(dtype).lower()
    text = text[len("torch."):] if text.startswith("torch.") else text
    name = _DTYPE_NAMES.get(text, text)
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype must name a KV element type ({', '.join(DTYPE_BYTES)} or "
                         f"their torch names), not {dtype!r}")
    return name


def _name(field, value):
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(f"{field} must be 1-64 characters of [A-Za-z0-9._+-], not {value!r}")
    return value


def _positive(field, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field} must be a positive int, not {value!r}")
    return value


def _geometry(segments, segment_bytes):
    """"2x524288" for equal segments; unequal ones are listed when short,
    else summed and digested so the key stays short."""
    count = _positive("segments", segments)
    if isinstance(segment_bytes, int):
        sizes = [segment_bytes] * count
    else:
        sizes = list(segment_bytes)
        if len(sizes) != count:
            raise ValueError(f"segment_bytes lists {len(sizes)} sizes for {count} segments")
    for size in sizes:
        _positive("segment_bytes", size)
    if len(set(sizes)) == 1:
        return f"{count}x{sizes[0]}"
    listed = "+".join(map(str, sizes))
    if len(listed) <= 64:
        return listed
    digest = hashlib.sha256(listed.encode()).hexdigest()[:8]
    return f"{count}s{sum(sizes)}~{digest}"


def _coordinate(axis, rank, size):
    if rank is None and size is None:
        return ""
    _positive(f"{axis}_size", size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"{axis}_rank must be an int in [0, {axis}_size={size}), not {rank!r}")
    return f"{axis}{rank}of{size}"


def _hash_text(content_hash):
    if isinstance(content_hash, (bytes, bytearray)):
        text = content_hash.hex()
    elif isinstance(content_hash, int) and not isinstance(content_hash, bool):
        text = format(content_hash, "x")
    elif isinstance(content_hash, str):
        text = content_hash
    else:
        raise ValueError(f"a content hash is str, bytes or int, not {type(content_hash).__name__}")
    if not text or len(text.encode()) > _MAX_HASH_BYTES:
        raise ValueError(f"a content hash must be 1-{_MAX_HASH_BYTES} bytes, not {len(text)}")
    return text
