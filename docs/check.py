"""Keeps the project's Markdown honest (make lint).

Links: every link of README.md, docs/*.md, bench/README.md and soak/README.md
that is not a URL must name a file or directory of the repository and,
with a #anchor into a Markdown file, one of that file's headings, as
GitHub makes their anchors. A code span that is a path of the repository
(`src/thread/run.rs`) must name a file that exists, so that the docs
follow files that move.

Reference: every directive the module registers (its command table and
the settings' entries, src/) has a `## NAME` entry in docs/directives.md,
and every function of lua/resty/threadpool.lua one in docs/lua-api.md;
README.md's tables link each of them.

Prints each problem and exits 1.

    python3 docs/check.py
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ["README.md", "bench/README.md", "soak/README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# A code span that is a path into one of the repository's folders.
PATH_SPAN = re.compile(r"`((?:src|tests|lua|bench|soak|handler|nginx-conf|matrix|examples)/[\w./-]*)`")
# [text](target): text may hold code spans and balanced brackets.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)\)")


def prose(text):
    """The lines outside fenced code blocks, with their numbers."""
    fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def anchors(path):
    """The anchors GitHub gives the headings of a Markdown file."""
    seen = {}
    for _, line in prose(path.read_text()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = CODE_SPAN.sub(lambda c: c.group(2), m.group(1))
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        yield slug if n == 0 else f"{slug}-{n}"


def broken(name):
    """The broken links of one file, as messages."""
    path = ROOT / name
    for number, line in prose(path.read_text()):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{name}:{number}: {target}"
            if not dest.exists():
                yield f"{where}: no such file"
            elif anchor and dest.suffix == ".md" and anchor not in set(anchors(dest)):
                yield f"{where}: no heading with that anchor"
        for m in PATH_SPAN.finditer(line):
            if not (ROOT / m.group(1)).exists():
                yield f"{name}:{number}: `{m.group(1)}`: no such file"


def registered():
    """The directives of src/ (with nginx's own `thread_pool`, which the
    module takes over) and the functions of the Lua library."""
    src = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.rs"))
    directives = {"thread_pool"}
    directives |= set(re.findall(r'command\(\s*ngx_string\(c"(\w+)"\)', src))
    directives |= set(re.findall(r'name: c"(\w+)"', src))
    lua = (ROOT / "lua/resty/threadpool.lua").read_text()
    functions = set(re.findall(r"^function (?:Pool|_M)\.(\w+)\(", lua, re.M))
    return {"directives": directives, "lua-api": functions}


def undocumented():
    """What the module offers that its reference or the README misses."""
    readme = (ROOT / "README.md").read_text()
    for doc, names in registered().items():
        headings = set(anchors(ROOT / "docs" / f"{doc}.md"))
        for name in sorted(names):
            if name not in headings:
                yield f"docs/{doc}.md: no `## {name}` entry"
            if f"(docs/{doc}.md#{name})" not in readme:
                yield f"README.md: no link to docs/{doc}.md#{name}"


def main():
    problems = [p for name in FILES for p in broken(name)]
    problems += undocumented()
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
