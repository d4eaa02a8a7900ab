"""Visitor text (labels, prompt templates, file names, a results file's fields) shown as plain text.

Streamlit renders ``st.caption``, ``st.error``, ``st.info`` and ``st.markdown`` as GitHub-flavoured
Markdown, and Plotly renders its own tags (``<a href>``, ``<b>``, ``<br>``, ...) in titles, tick
labels, legends and hover text. Text a visitor typed or uploaded goes through:

* :func:`md_plain` wherever it is part of Markdown: every ASCII punctuation character is
  backslash-escaped (CommonMark: it then stands for itself), so no link, image, emphasis,
  code, heading, list, table, HTML or maths can start; and a zero-width space after ``:``,
  before ``@`` and after ``www`` breaks the bare URLs, ``www.`` names and e-mail addresses that
  GitHub-flavoured Markdown (and Streamlit's ``:emoji:`` and ``:color[...]`` shortcodes) would
  otherwise turn into links;
* :func:`plotly_plain` wherever it goes into a figure: ``&``, ``<`` and ``>`` as entities,
  which Plotly shows as the characters and never reads as tags.
"""

from __future__ import annotations

import re

__all__ = ["md_plain", "plotly_plain", "ZWSP"]

ZWSP = "\u200b"
_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_WWW = re.compile(r"(?i)(www)(?=\\\.)")


def md_plain(text: object) -> str:
    """``text`` as Markdown that renders to exactly its characters (plus invisible zero-width spaces)."""
    out = []
    for ch in str(text):
        if ch == ":":
            out.append("\\:" + ZWSP)
        elif ch == "@":
            out.append(ZWSP + "\\@")
        elif ch in _PUNCT:
            out.append("\\" + ch)
        elif ch in "\r\n":
            out.append(" ")  # one paragraph: a line break could start a heading, list or code block
        else:
            out.append(ch)
    return _WWW.sub(lambda m: m.group(1) + ZWSP, "".join(out))


def plotly_plain(text: object) -> str:
    """``text`` for a Plotly title, tick label, legend or hover text: shown as is, never read as tags."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
