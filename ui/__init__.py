"""The app's library: what the page scripts in ``pages/`` share (serving, caches, session state, widgets, views).

It sits beside ``pages/`` rather than inside it because Streamlit treats every file in
``pages/`` as a page. It reads widgets and session state and calls ``vitviz``; ``vitviz``
never imports it.
"""
