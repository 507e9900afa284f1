"""The built site's equations render with the network off.

    python .ci/check_math.py SITE [--out DIR] [--static-only]

Two checks of SITE (the output of ``mkdocs build``):

1. **Static** (Python, always): no page loads a script, stylesheet or font from another
   host (MathJax and its fonts are served with the site, ``docs/javascripts/mathjax``);
   every page with an equation loads that MathJax; every equation is inside an
   ``arithmatex`` element (what MathJax is configured to typeset) and none holds a control
   character (a TeX command eaten by a Python string escape, such as ``\\f`` of ``\\frac``).
2. **In a browser** (unless ``--static-only``): ``.ci/check_math.mjs`` opens every page
   with an equation in a headless Chromium that refuses every request to another host, lets MathJax typeset,
   and counts the equations left as raw TeX and those in error (an undefined macro); it
   writes ``DIR/math.json`` and screenshots of the three pages with the most equations.
   The browser (``@sparticuz/chromium``, a Chromium inside an npm package) and its driver
   (``puppeteer-core``) are installed with npm, pinned below, into
   ``$DMIMO_JAX_CI_BROWSER`` (default ``~/.cache/dmimo_jax/ci-browser``) on first use.

Exits 1 on any finding, naming the page.
"""

from __future__ import annotations

import argparse
import html.parser
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

BROWSER_PACKAGES = ("@sparticuz/chromium@147.0.0", "puppeteer-core@24.43.1")
MATHJAX = "javascripts/mathjax/tex-chtml-full.js"


class _Page(html.parser.HTMLParser):
    """What one page loads and the text of its equations."""

    def __init__(self):
        super().__init__()
        self.remote: list[str] = []
        self.scripts: list[str] = []
        self.equations: list[str] = []
        self._depth = 0  # > 0 inside an arithmatex element

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        url = attrs.get("src") if tag in ("script", "img") else None
        if tag == "link" and attrs.get("rel") in ("stylesheet", "preload", "modulepreload"):
            url = attrs.get("href")
        if url:
            if url.startswith(("http:", "https:", "//")):
                self.remote.append(url)
            if tag == "script":
                self.scripts.append(url)
        if self._depth:
            self._depth += 1
        elif "arithmatex" in (attrs.get("class") or "").split():
            self._depth = 1
            self.equations.append("")

    def handle_endtag(self, tag):
        if self._depth:
            self._depth -= 1

    def handle_data(self, data):
        if self._depth:
            self.equations[-1] += data


def static_findings(site: pathlib.Path) -> tuple[list[str], dict]:
    """The static check's findings (empty when the site passes) and its counts."""
    findings, counts = [], {"pages": 0, "pages_with_math": 0, "equations": 0}
    if not (site / MATHJAX).is_file():
        findings.append(f"{MATHJAX} is not in the site")
    for path in sorted(site.rglob("*.html")):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        name = str(path.relative_to(site))
        counts["pages"] += 1
        findings += [f"{name}: loads {url} from another host" for url in page.remote]
        if not page.equations:
            continue
        counts["pages_with_math"] += 1
        counts["equations"] += len(page.equations)
        if not any(s.endswith(MATHJAX) for s in page.scripts):
            findings.append(f"{name}: {len(page.equations)} equations but no {MATHJAX}")
        for tex in page.equations:
            bad = sorted({f"\\x{ord(c):02x}" for c in tex if ord(c) < 32 and c not in "\n\t\r"})
            if bad:
                findings.append(f"{name}: control characters {bad} in {tex.strip()[:60]!r}")
    return findings, counts


def browser_dir() -> pathlib.Path:
    """The npm prefix holding the browser and its driver, installed on first use."""
    default = pathlib.Path.home() / ".cache" / "dmimo_jax" / "ci-browser"
    prefix = pathlib.Path(os.environ.get("DMIMO_JAX_CI_BROWSER", default))
    marker = prefix / "installed.txt"
    if not marker.is_file() or marker.read_text() != " ".join(BROWSER_PACKAGES):
        prefix.mkdir(parents=True, exist_ok=True)
        (prefix / "package.json").write_text('{"name": "ci-browser", "private": true}\n')
        subprocess.run(
            [
                "npm",
                "install",
                "--silent",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(prefix),
                *BROWSER_PACKAGES,
            ],
            check=True,
        )
        marker.write_text(" ".join(BROWSER_PACKAGES))
    return prefix


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=pathlib.Path)
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help="math.json and screenshots (default: a temporary folder)",
    )
    parser.add_argument("--static-only", action="store_true", help="skip the browser")
    args = parser.parse_args()
    findings, counts = static_findings(args.site)
    print(
        f"static: {counts['pages']} pages, {counts['equations']} equations on {counts['pages_with_math']} pages, {len(findings)} findings"
    )
    for finding in findings:
        print(f"  {finding}")
    if args.static_only:
        return 1 if findings else 0
    if shutil.which("node") is None or shutil.which("npm") is None:
        print(
            "the browser check needs node and npm on the PATH (or --static-only)", file=sys.stderr
        )
        return 1
    prefix = browser_dir()
    script = prefix / "check_math.mjs"  # beside its node_modules, where node resolves the imports
    shutil.copyfile(pathlib.Path(__file__).with_name("check_math.mjs"), script)
    out = args.out or pathlib.Path(tempfile.mkdtemp())
    browser = subprocess.run(["node", str(script), str(args.site), str(out)], check=False)
    summary = (
        json.loads((out / "math.json").read_text())["summary"]
        if (out / "math.json").is_file()
        else None
    )
    print(f"browser (network off): {summary}; report and screenshots in {out}")
    return 1 if findings or browser.returncode or summary is None else 0


if __name__ == "__main__":
    sys.exit(main())
