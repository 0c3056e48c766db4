#!/usr/bin/env bash
# Vendors the crates of Cargo.lock into DIR/vendor (cargo vendor, on this
# machine: the build chroot reaches only Debian's archive, and Debian does
# not package these crates at the versions the lock names) and adds a
# paragraph per crate to DIR/debian/copyright, from the crate's Cargo.toml
# (authors, license), before the stand-alone License paragraphs. A license
# that has no such paragraph yet is an error naming the crate: its text
# goes into debian/copyright.
#
#   packaging/vendor.sh target/debian/build/libnginx-mod-http-threadpool-0.1.0
set -euo pipefail
dir=$1
(cd "$dir" && cargo vendor --quiet --locked --versioned-dirs vendor > /dev/null)
/usr/bin/python3 -B - "$dir" <<'PY'
import pathlib, re, sys, tomllib

root = pathlib.Path(sys.argv[1])
path = root / "debian/copyright"
paragraphs = path.read_text().rstrip("\n").split("\n\n")
known = {p.split("\n")[0][len("License: "):] for p in paragraphs if p.startswith("License: ")}
first_license = next(i for i, p in enumerate(paragraphs) if p.startswith("License: "))


def dep5(expr):
    """An SPDX expression (or the old a/b form) in copyright-format's words:
    `(A OR B) AND C` is `A or B, and C`."""
    expr = expr.replace("/", " OR ")
    m = re.fullmatch(r"\((.*)\) AND (.*)", expr)
    if m:
        expr = f"{m[1]}, AND {m[2]}"
    assert "(" not in expr, expr
    return re.sub(r"\s+", " ", expr.replace(" OR ", " or ").replace(" AND ", " and ")).strip()


crates = []
for manifest in sorted((root / "vendor").glob("*/Cargo.toml")):
    package = tomllib.loads(manifest.read_text())["package"]
    license = dep5(package["license"])
    for name in re.split(r",? and | or ", license):
        if name.strip() not in known:
            sys.exit(f"vendor.sh: {manifest.parent.name}: no License paragraph for {name!r} in debian/copyright")
    authors = package.get("authors") or [f"the {package['name']} authors"]
    crates.append(
        f"Files: vendor/{manifest.parent.name}/*\n"
        + "Copyright: " + "\n ".join(authors) + "\n"
        + f"License: {license}"
    )
paragraphs[first_license:first_license] = crates
path.write_text("\n\n".join(paragraphs) + "\n")
PY
