"""`gdrkv serve --config FILE`: a TOML file holding any of the flags of
`gdrkv serve` under their long names with underscores (listen, memory,
metrics_listen, auth_token_file, pretouch = false for --no-pretouch, ...).
A flag given on the command line wins over the file; a key that names no
flag is an error naming it, as is a value of the wrong kind. The flags are
made from the server's options table (gdrkv.server.OPTIONS), so the keys
are too."""
import argparse
import json
import tomllib

from .server import OPTIONS

# Flags that are about reading the configuration, not part of it.
_NOT_SETTINGS = {"help", "config", "print_config"}


def settings(parser):
    """The serve parser's settings: {dest: action}."""
    return {a.dest: a for a in parser._actions
            if a.option_strings and a.dest not in _NOT_SETTINGS}


def apply(parser, args, argv):
    """Fills args from the file args.config, for every setting argv does not
    give; raises ValueError naming the file and the key at fault."""
    if not args.config:
        return
    try:
        with open(args.config, "rb") as f:
            table = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"config {args.config}: {e}") from None
    known = settings(parser)
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"config {args.config}: unknown key {unknown[0]!r} (known: "
                         f"{', '.join(sorted(known))})")
    given = {a.dest for a in known.values() for opt in a.option_strings
             if any(word == opt or word.startswith(opt + "=") for word in argv)}
    for key, value in table.items():
        if key not in given:
            setattr(args, key, _value(args.config, known[key], key, value))


def _value(path, action, key, value):
    flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
    if flag != isinstance(value, bool):
        raise ValueError(f"config {path}: {key} must be {'true or false' if flag else 'a value'}"
                         f", not {value!r}")
    if flag:
        return value
    if isinstance(value, (dict, list)):
        raise ValueError(f"config {path}: {key} must be a string or a number")
    if action.type is not None:
        try:
            value = action.type(str(value))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            raise ValueError(f"config {path}: {key}: {e}") from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"config {path}: {key} must be one of {', '.join(action.choices)}, "
                         f"not {value!r}")
    return value


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
