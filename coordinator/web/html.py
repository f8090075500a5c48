"""Escaping for the console's server-rendered HTML: every value is text until escaped.

:class:`Html` marks markup already built (by :func:`esc` or :func:`tag`); anything else that reaches a
page goes through :func:`esc` (``&``, ``<``, ``>``, ``"`` and ``'`` become entities), so a hostile task
name, log line or label is shown as text, never parsed as markup, in an element or in an attribute.
Attribute values are always quoted. No page holds inline script or style (the Content-Security-Policy
forbids them): behaviour is in ``static/app.js``, looks in ``static/app.css``.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from urllib.parse import quote, urlencode

__all__ = ["Html", "esc", "join", "tag", "url"]


class Html(str):
    """A string of markup that is safe to insert as it is."""

    __slots__ = ()


def esc(value: object) -> Html:
    """``value`` as markup: itself when already :class:`Html`, else its text escaped."""
    if isinstance(value, Html):
        return value
    return Html(html.escape(str(value), quote=True))


def join(parts: Iterable[object], sep: str = "") -> Html:
    """The parts, each escaped unless already :class:`Html`, joined by ``sep`` (markup)."""
    return Html(sep.join(esc(p) for p in parts))


def tag(name: str, content: object = "", /, **attrs: object) -> Html:
    """``<name attrs>content</name>``: attribute values and the content escaped (an attribute whose value is
    None or False is left out; ``cls`` is ``class``, ``data_x`` is ``data-x``)."""
    shown = "".join(f' {"class" if k == "cls" else k.replace("_", "-")}="{esc(v)}"'
                    for k, v in attrs.items() if v is not None and v is not False)
    return Html(f"<{name}{shown}>{esc(content)}</{name}>")


def url(path: str, *segments: str, **query: object) -> str:
    """``path`` with each segment percent-encoded (``/tasks`` + ``t-1``) and the non-empty query items."""
    out = path + "".join("/" + quote(s, safe="") for s in segments)
    items = {k: v for k, v in query.items() if v not in ("", None)}
    return out + ("?" + urlencode(items) if items else "")
