"""Visitor text rendered as plain text: checked with an independent CommonMark renderer (markdown-it-py)."""

from __future__ import annotations

import html
import re

import pytest
from markdown_it import MarkdownIt

from vitviz.text import ZWSP, md_plain, plotly_plain

HOSTILE = [
    "[click me](http://evil.example/x)",
    "![tracker](http://evil.example/pixel.png)",
    "<img src=x onerror=alert(1)> <a href='http://evil.example'>a</a>",
    "**bold** _it_ `code` ~~gone~~ $x^2$",
    "# heading",
    "- item",
    "1. first",
    "> quote",
    "| a | b |",
    "http://evil.example/path?q=1",
    "www.evil.example",
    "mail me@evil.example",
    ":red[coloured] :smile: :material/home:",
    "cat & dog \\ back\\slash",
    "plain cat",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_renders_exactly_the_characters(text):
    rendered = MarkdownIt("commonmark").render(md_plain(text))
    assert rendered.startswith("<p>") and rendered.endswith("</p>\n")
    inner = rendered[3:-5]
    assert not re.search(r"<(a|img|em|strong|code|h\d|li|blockquote|table|s)\b", inner)
    assert html.unescape(inner).replace(ZWSP, "") == text


@pytest.mark.parametrize("text", HOSTILE)
def test_bare_links_and_shortcodes_are_broken(text):
    """GFM autolinks (and Streamlit shortcodes) need these characters side by side; they never are."""
    shown = html.unescape(MarkdownIt("commonmark").render(md_plain(text)))
    assert not re.search(r"https?://|www\.|\w@\w|:\w", shown)


@pytest.mark.parametrize("text", HOSTILE)
def test_plotly_sees_no_tags(text):
    out = plotly_plain(text)
    assert "<" not in out and ">" not in out
    assert html.unescape(out) == text


def test_newlines_do_not_start_blocks():
    rendered = MarkdownIt("commonmark").render(md_plain("cat\n# dog\n    code"))
    assert rendered.count("<p>") == 1 and "<h1>" not in rendered and "<pre>" not in rendered
