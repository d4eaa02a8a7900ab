"""The app's pages and the switch out of Streamlit's legacy folder mode; nothing heavy is imported here.

``app.py`` draws the navigation from :data:`PAGES` before it imports the engine (torch takes
seconds to import on a cold start), so a first visit sees the app's own page names at once.
"""

from __future__ import annotations

from typing import NamedTuple

import streamlit as st

__all__ = ["PageEntry", "PAGES", "leave_folder_mode", "navigation"]


class PageEntry(NamedTuple):
    script: str  # path of the page script, relative to app.py
    title: str
    icon: str


PAGES = (
    PageEntry("pages/overview.py", "Image & predictions", ":material/image:"),
    PageEntry("pages/heads.py", "Heads", ":material/grid_view:"),
    PageEntry("pages/layers.py", "Layers & rollout", ":material/layers:"),
    PageEntry("pages/importance.py", "Head importance", ":material/science:"),
    PageEntry("pages/patching.py", "Activation patching", ":material/swap_horiz:"),
    PageEntry("pages/features.py", "Features (SAE)", ":material/category:"),
    PageEntry("pages/compare.py", "Compare explanations", ":material/compare:"),
    PageEntry("pages/side_by_side.py", "Side by side", ":material/splitscreen:"),
    PageEntry("pages/dataset.py", "Data set", ":material/dataset:"),
    PageEntry("pages/positions.py", "Position embeddings", ":material/explore:"),
    PageEntry("pages/embedding.py", "Patch embedding & norms", ":material/extension:"),
)


def leave_folder_mode() -> None:
    """Leave Streamlit's legacy folder-based multipage mode before drawing anything.

    With a ``pages/`` folder beside the main script, the first run in a fresh server
    process (and every AppTest run) goes through that legacy mode until
    ``st.navigation`` is called: its sidebar lists the files of ``pages/`` and widgets of
    that run get other ids (a file uploaded right after a restart was silently lost).
    Switching the flag off and rerunning makes every drawn run a normal ``st.navigation`` run.
    """
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


def navigation():
    """The app's navigation (the first page is the default), drawn as links at the top of the sidebar; returns the
    page to run.

    Streamlit's own sidebar list is switched off (``client.showSidebarNavigation`` in ``.streamlit/config.toml``):
    a fresh server's first run goes through the legacy folder mode (:func:`leave_folder_mode`), whose list named
    the files of ``pages/`` for a moment before this navigation replaced it. The links here only ever name the
    app's pages.
    """
    pages = [st.Page(p.script, title=p.title, icon=p.icon, default=i == 0) for i, p in enumerate(PAGES)]
    page = st.navigation(pages, position="hidden")
    with st.sidebar:
        for p, entry in zip(pages, PAGES, strict=True):
            st.page_link(p, label=entry.title, icon=entry.icon)
        st.divider()
    return page
