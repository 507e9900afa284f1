"""A griffe extension of the docs build: the package's docstrings use Sphinx roles (they read
well in ``help()`` and an editor); the site renders them as mkdocstrings renders Markdown.

- ``:func:`~dmimo_jax.x.f``` (and ``class``, ``meth``, ``mod``, ``attr``, ``data``, ``obj``,
  ``exc``) become cross-references (mkdocs-autorefs), ``~`` keeping the last name as the
  label. A name without its module (``:func:`calibrate```) is looked up from the object's
  class, then its module, then the package above; a name nobody documents (JAX's, NumPy's)
  is shown as code.
- ``:math:`...``` becomes inline math and ``.. math::`` a display block (pymdownx.arithmatex,
  typeset by MathJax).

The docstrings themselves are not changed; only the copies griffe hands to mkdocstrings.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc):`(~?)([^`]+)`")
MATH = re.compile(r":math:`([^`]+)`")
DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<rest>.*)$")


def display_math(text: str) -> str:
    """``.. math:: expr`` or ``.. math::`` and an indented block, as ``$$`` blocks."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = DIRECTIVE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, body = m["indent"], [m["rest"].strip()] if m["rest"].strip() else []
        i += 1
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)
        ):
            if lines[i].strip():
                body.append(lines[i].strip())
            elif body:  # a blank line after the equation ends it
                break
            i += 1
        out += ["", f"{indent}$$", *(f"{indent}{b}" for b in body), f"{indent}$$", ""]
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **_: Any) -> None:
        collection = loader.modules_collection

        def lookup(path: str) -> str | None:
            try:
                obj = collection[path]
            except Exception:  # noqa: BLE001 - not documented here (another package)
                return None
            return obj.path

        def scopes(obj: griffe.Object) -> list[str]:
            out, parent = [], obj if obj.is_class or obj.is_module else obj.parent
            while parent is not None:
                out.append(parent.path)
                parent = parent.parent
            return out

        def rewrite(obj: griffe.Object) -> None:
            if obj.docstring is None:
                return
            where = scopes(obj)

            def role(m: re.Match) -> str:
                short, target = m[1] == "~", m[2].strip()
                label = target.rsplit(".", 1)[-1] if short else target
                for scope in ["", *where]:
                    path = lookup(f"{scope}.{target}" if scope else target)
                    if path is not None:
                        ident = html.escape(path, quote=True)
                        return (
                            f'<autoref identifier="{ident}" optional><code>{label}</code></autoref>'
                        )
                return f"`{label}`"

            value = display_math(obj.docstring.value)
            value = MATH.sub(lambda m: f"${m[1].strip()}$", value)
            obj.docstring.value = ROLE.sub(role, value)

        def walk(obj: griffe.Object) -> None:
            rewrite(obj)
            for member in obj.members.values():
                if not member.is_alias:
                    walk(member)

        walk(pkg)
