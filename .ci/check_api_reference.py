"""Check the built documentation site: every public name (``__all__`` of ``dmimo_jax`` and of
each module with a page under docs/api/) has an entry somewhere in the API reference (the
top-level names on the Basic pages, api/basic/), at least ``MIN_DESCRIBED`` of the
reference's entries say something (a bare heading does not), no API page is over
``MAX_PAGE_KB``, and no page shows a raw Sphinx role (``:func:``, ``:math:``, ...: the build renders them).

    python .ci/check_api_reference.py SITE_DIR
"""

import importlib
import pathlib
import re
import sys
import types

MIN_DESCRIBED = 0.95
OBJECT = re.compile(r'<div class="doc doc-object doc-(\w+)">')


def described(html: str) -> tuple[int, int]:
    """(entries, entries with a description) of one API page: an entry whose contents hold
    no paragraph or table (before its first member) is a bare heading."""
    parts = OBJECT.split(html)
    total = with_text = 0
    for chunk in parts[2::2]:
        own = re.split(r'<div class="doc doc-children">|<div class="doc doc-object', chunk)[0]
        total += 1
        with_text += "<p>" in own or "<table" in own
    return total, with_text


MAX_PAGE_KB = 150


def main(site: str) -> int:
    site_dir = pathlib.Path(site)
    pages = sorted(pathlib.Path("docs/api").glob("*.md"))  # one per module (index: the top)
    html = {
        str(f.parent.relative_to(site_dir / "api")): f.read_text()
        for f in sorted((site_dir / "api").rglob("index.html"))
    }  # every API page, the Basic ones (api/basic/...) included
    ids = {i for text in html.values() for i in re.findall(r'id="([^"]+)"', text)}
    missing = []
    for page in pages:
        module = "dmimo_jax" if page.stem == "index" else f"dmimo_jax.{page.stem}"
        mod = importlib.import_module(module)
        for n in getattr(mod, "__all__", []):
            if isinstance(getattr(mod, n), types.ModuleType) and n in {p.stem for p in pages}:
                continue  # a subpackage: its own page
            # a function that shares its module's name is documented as module.name.name
            if f"{module}.{n}" not in ids and f"{module}.{n}.{n}" not in ids:
                missing.append(f"{module}.{n}")
    entries = with_text = 0
    sizes = {}
    for name, text in html.items():
        t, w = described(text)
        entries, with_text = entries + t, with_text + w
        sizes[name] = len(text.encode()) // 1024
    share = with_text / max(entries, 1)
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    print(
        f"API reference: {len(html)} pages, {entries} entries, {with_text} with a description "
        f"({100 * share:.1f}%); largest pages {', '.join(f'{k} {v} KB' for k, v in largest)}"
    )
    if share < MIN_DESCRIBED:
        missing.append(
            f"only {100 * share:.1f}% of the entries say something (< {MIN_DESCRIBED:.0%})"
        )
    over = [f"{k} ({v} KB)" for k, v in sizes.items() if v > MAX_PAGE_KB]
    if over:
        missing.append(
            f"API pages over {MAX_PAGE_KB} KB (split them by concept): {', '.join(over)}"
        )
    raw = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc|math):`?")
    for html_file in sorted(site_dir.rglob("*.html")):
        found = raw.findall(html_file.read_text())
        if found:
            missing.append(
                f"{html_file.relative_to(site_dir)}: {len(found)} raw roles ({found[0]})"
            )
    if missing:
        print(f"{len(missing)} public names without an entry or pages with raw roles:")
        print("\n".join(f"  {m}" for m in missing))
        return 1
    print(f"API reference: every public name of {len(pages)} modules has an entry; no raw role")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "site"))
