"""Check the built documentation site: every public name (``__all__`` of ``dmimo_jax`` and of
each module with a page under docs/api/) has an entry in the API reference, and no page shows a
raw Sphinx role (``:func:``, ``:math:``, ...: the build renders them).

    python .ci/check_api_reference.py SITE_DIR
"""

import importlib
import pathlib
import re
import sys
import types


def main(site: str) -> int:
    site_dir = pathlib.Path(site)
    pages = sorted(pathlib.Path("docs/api").glob("*.md"))
    missing = []
    for page in pages:
        module = "dmimo_jax" if page.stem == "index" else f"dmimo_jax.{page.stem}"
        html_path = site_dir / "api" / ("" if page.stem == "index" else page.stem) / "index.html"
        html = html_path.read_text()
        ids = set(re.findall(r'id="([^"]+)"', html))
        mod = importlib.import_module(module)
        for n in getattr(mod, "__all__", []):
            if isinstance(getattr(mod, n), types.ModuleType) and n in {p.stem for p in pages}:
                continue  # a subpackage: its own page
            # a function that shares its module's name is documented as module.name.name
            if f"{module}.{n}" not in ids and f"{module}.{n}.{n}" not in ids:
                missing.append(f"{module}.{n}")
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
