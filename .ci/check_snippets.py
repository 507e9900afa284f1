"""Every Python block of the site runs, or says why not.

A ```python block in docs/ is run by one of: markdown-exec when the site is built
(``exec="on"``), pytest's doctests (a block of ``>>>`` lines, --doctest-glob=*.md), or is
marked on the line before it with ``<!-- not run: REASON -->``. Anything else fails.

    python .ci/check_snippets.py [DOCS_DIR]
"""

import pathlib
import re
import sys

FENCE = re.compile(r"^```python(.*)$")


def blocks(path: pathlib.Path):
    """(line number, how it runs, the line before) of each Python block of ``path``."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if not m:
            continue
        body = next((b for b in lines[i + 1 :] if b.strip()), "")
        before = lines[i - 1] if i else ""
        if 'exec="on"' in m.group(1):
            how = "executed at build"
        elif body.lstrip().startswith(">>>"):
            how = "doctest"
        elif re.match(r"<!-- not run: \S.* -->$", before.strip()):
            how = "not run (reason given)"
        else:
            how = None
        yield i + 1, how


def main(docs: str) -> int:
    counts, bad = {}, []
    for path in sorted(pathlib.Path(docs).rglob("*.md")):
        for line, how in blocks(path):
            if how is None:
                bad.append(f"{path}:{line}")
            counts[how] = counts.get(how, 0) + 1
    total = sum(counts.values())
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=str))
    if bad:
        print(f"{len(bad)} of {total} Python blocks neither run nor say why:")
        print("\n".join(f"  {b}" for b in bad))
        return 1
    print(f"Python blocks of the site: {total} ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "docs"))
