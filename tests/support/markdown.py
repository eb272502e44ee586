"""The fenced code blocks of the project's markdown (README.md, docs/*.md,
configs/*/README.md): where each is, its language tag and its text."""
import glob
import os
import re
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC_PATTERNS = ("README.md", "docs/*.md", "configs/*/README.md")
# An opening or closing fence: up to the indentation of a list item, three
# or more backticks or tildes, then the info string (its first word is the
# language).
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


class Block(NamedTuple):
    path: str           # relative to the repository root
    line: int           # of the opening fence, 1-based
    lang: str           # the info string's first word; "" when untagged
    text: str           # the lines between the fences, the fence's indentation removed

    @property
    def where(self):
        return f"{self.path}:{self.line}"


def doc_files(root=ROOT):
    """The markdown files whose blocks are checked, relative to root."""
    found = set()
    for pattern in DOC_PATTERNS:
        found.update(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, pattern)))
    return sorted(found)


def blocks(path, root=ROOT):
    """The fenced blocks of one markdown file, in order. An unclosed fence
    is an error, so a block can't swallow the rest of a file unseen."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    found, opening = [], None
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if opening is None:
            if match:
                opening, body = (number, match), []
            continue
        start, open_match = opening
        if (match and match["fence"][0] == open_match["fence"][0]
                and len(match["fence"]) >= len(open_match["fence"]) and not match["info"].strip()):
            indent = len(open_match["indent"])
            text = "\n".join(l[indent:] if l[:indent] == " " * indent else l.lstrip()
                              for l in body)
            words = open_match["info"].split()
            found.append(Block(path, start, words[0] if words else "", text + "\n"))
            opening = None
        else:
            body.append(line)
    if opening is not None:
        raise ValueError(f"{path}:{opening[0]}: a fenced block that never closes")
    return found


def all_blocks(root=ROOT):
    return [block for path in doc_files(root) for block in blocks(path, root)]
