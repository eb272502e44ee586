"""`gdrkv serve --config FILE`: a TOML file holding any of the flags of
`gdrkv serve` under their long names with underscores (listen, memory,
metrics_listen, auth_token_file, pretouch = false for --no-pretouch, ...).
A flag given on the command line, in any form argparse takes (--listen X,
--listen=X, an abbreviation such as --lis), wins over the file. Only a
regular file of at most MAX_BYTES is read. Every fault of the file (not
readable, not TOML, nested too deeply, a key that names no flag, a value of
the wrong kind) is one ValueError naming the file and, where there is one,
the key. The flags are made from the server's options table
(gdrkv.server.OPTIONS), so the keys are too."""
import argparse
import json
import os
import stat
import tomllib

from .server import OPTIONS

# A configuration is a few dozen lines: anything larger is not one.
MAX_BYTES = 1 << 20

# Flags that are about reading the configuration, not part of it.
_NOT_SETTINGS = {"help", "config", "print_config"}

# What a value of each option kind is written as in the file, beyond a
# string the flag's own parser takes: (TOML types, how the message says it).
_KINDS = {
    "text": ((str,), "a string"),
    "mode": ((str,), "one of auto, on, off"),
    "int": ((int,), "an integer"),
    "int_or_auto": ((int, str), "an integer or \"auto\""),
    "size": ((int, str), "a size (bytes, or a string such as \"64MiB\")"),
    "ratio": ((int, float), "a number"),
}
_MEMORY = ((int, str), "a size (bytes, or a string such as \"16GiB\" or \"25%\")")


def settings(parser):
    """The serve parser's settings: {dest: action}."""
    return {a.dest: a for a in parser._actions
            if a.option_strings and a.dest not in _NOT_SETTINGS}


def apply(parser, args, argv):
    """Fills args from the file args.config, for every setting the serve
    command line (argv: the whole command, "serve" and all) does not give;
    raises ValueError naming the file and the key at fault."""
    if not args.config:
        return
    known = settings(parser)
    table = read(args.config)
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"config {args.config}: unknown key {unknown[0]!r} (known: "
                         f"{', '.join(sorted(known))})")
    values = {key: _value(args.config, known[key], key, value) for key, value in table.items()}
    given = _given(parser, known, argv)
    for key, value in values.items():
        if key not in given:
            setattr(args, key, value)


def read(path):
    """The file's table. Opened without blocking (a FIFO would wait for a
    writer forever) and read only when it is a regular file of at most
    MAX_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"config {path}: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"config {path}: not a regular file")
        data = b""
        while len(data) <= MAX_BYTES and (part := os.read(fd, MAX_BYTES + 1 - len(data))):
            data += part
    except OSError as e:
        raise ValueError(f"config {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"config {path}: larger than {MAX_BYTES >> 10} KiB: not a configuration")
    try:
        return tomllib.loads(data.decode())
    except UnicodeDecodeError as e:
        raise ValueError(f"config {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config {path}: {e}") from None
    except RecursionError:
        raise ValueError(f"config {path}: arrays or tables nested too deeply") from None


def _given(parser, known, argv):
    """The settings the serve command line gives, as argparse read them:
    parsed again into a namespace that already holds a marker for each, so
    argparse fills in no default and what it set is what was given."""
    marker = object()
    words = list(argv)
    words = words[words.index("serve") + 1:] if "serve" in words else words
    namespace = argparse.Namespace(**{dest: marker for dest in known})
    parser.parse_known_args(words, namespace)
    return {dest for dest in known if getattr(namespace, dest) is not marker}


def _value(path, action, key, value):
    """The file's value of a setting, as its flag would have given it."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise _wrong(path, key, "true or false", value)
        return value
    types, wanted = _MEMORY if key == "memory" else _KINDS[OPTIONS[key].kind]
    if isinstance(value, bool) or not isinstance(value, types):
        raise _wrong(path, key, wanted, value)
    if action.choices is not None and value not in action.choices:
        raise _wrong(path, key, wanted, value)
    if action.type is not None:
        try:
            return action.type(str(value))     # checked as the flag's word would be
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            raise ValueError(f"config {path}: {key}: {e}") from None
    return value


def _wrong(path, key, wanted, value):
    shown = repr(value) if len(repr(value)) <= 60 else type(value).__name__
    return ValueError(f"config {path}: {key} must be {wanted}, not {shown}")


def dump(parser, args):
    """The effective settings as TOML (what --print-config prints): a
    setting left unset shows the C default it runs with."""
    lines = []
    for key in settings(parser):
        value = getattr(args, key)
        if value is None:
            value = OPTIONS[key].default
        if value is not None:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"
