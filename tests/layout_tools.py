"""Reading a page's layout in Chromium: Plotly texts that are clipped or overlap, and where the main map sits.

Used by tests/test_browser_first_hour.py (issue 32.10) at 1366 x 768. Plotly draws every text as SVG: figure
titles (``.gtitle``), axis titles (``.xtitle``, ``.ytitle``, ...), tick labels (``.xtick text``, ...),
annotations (tile titles, subplot titles: ``.annotation-text``), the colour bar's title and ticks.
"""

from __future__ import annotations

from browser_tools import PLOTS

# Problems of every Plotly figure on the page: a text outside its figure (clipped), a title or axis title on top
# of another text, two annotations (tile titles) on top of each other; and Streamlit buttons whose label does not
# fit. Each: {figure, kind, text, other}.
LAYOUT_PROBLEMS_JS = f"""() => {{
    const out = [];
    const r = el => el.getBoundingClientRect();
    const area = (a, b) => Math.max(0, Math.min(a.right, b.right) - Math.max(a.left, b.left))
        * Math.max(0, Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top));
    const visible = el => {{ const b = r(el); return b.width > 0.5 && b.height > 0.5 && el.textContent.trim(); }};
    for (const fig of document.querySelectorAll("{PLOTS}")) {{
        const name = ((fig.layout || {{}}).title || {{}}).text || fig.closest("[data-testid]")?.dataset.testid || "";
        const box = r(fig.querySelector(".main-svg") || fig);
        const q = sel => Array.from(fig.querySelectorAll(sel)).filter(visible);
        const titles = q(".gtitle");
        const axisTitles = q("text[class$='title']:not(.gtitle):not(.cbtitle)");
        const ticks = q("g[class$='tick'] text, g[class$='tick2'] text");
        const notes = q(".annotation-text");
        const bar = q(".cbtitle text, .cbtitle, g.cbaxis text");
        for (const t of [...titles, ...axisTitles, ...ticks, ...notes, ...bar]) {{
            const b = r(t);
            if (b.left < box.left - 1 || b.right > box.right + 1 || b.top < box.top - 1 || b.bottom > box.bottom + 1)
                out.push({{figure: name, kind: "clipped", text: t.textContent, other: ""}});
        }}
        const pairs = (xs, ys, kind) => xs.forEach(a => ys.forEach(b => {{
            if (a !== b && !a.contains(b) && !b.contains(a) && area(r(a), r(b)) > 4)
                out.push({{figure: name, kind, text: a.textContent, other: b.textContent}});
        }}));
        pairs(titles, [...axisTitles, ...ticks, ...notes, ...bar], "title overlaps");
        pairs(axisTitles, ticks, "axis title over tick labels");
        notes.forEach((a, i) => notes.slice(i + 1).forEach(b => {{
            if (area(r(a), r(b)) > 4) out.push({{figure: name, kind: "annotations overlap", text: a.textContent, other: b.textContent}});
        }}));
    }}
    for (const b of document.querySelectorAll("[data-testid='stBaseButton-primary'], [data-testid='stBaseButton-secondary']")) {{
        const label = b.querySelector("p") || b;
        if (b.scrollWidth > b.clientWidth + 1 || label.scrollWidth > label.clientWidth + 1 || r(b).height > 60)
            out.push({{figure: "", kind: "button label does not fit", text: b.innerText, other: ""}});
    }}
    return out;
}}"""

# The top and bottom (page coordinates, with the page scrolled to its top) of the plot area of the first Plotly
# figure whose title holds ``words``.
MAP_BOX_JS = f"""(words) => {{
    const fig = Array.from(document.querySelectorAll("{PLOTS}"))
        .find(el => (((el.layout || {{}}).title || {{}}).text || "").includes(words));
    if (!fig) return null;
    const plot = (fig.querySelector(".nsewdrag") || fig).getBoundingClientRect();
    return {{top: plot.top + window.scrollY, bottom: plot.bottom + window.scrollY, left: plot.left, right: plot.right}};
}}"""


def layout_problems(page) -> list[dict]:
    return page.evaluate(LAYOUT_PROBLEMS_JS)


def map_box(page, words: str) -> dict | None:
    return page.evaluate(MAP_BOX_JS, words)
