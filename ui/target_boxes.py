"""The boxes that choose what a view explains: the class or zero-shot label, "…minus" another, and a
two-tower model's labels and prompt template, on any page.

Streamlit wiring only, like :mod:`ui.common` (whose session state, ``Classes`` and ``Current`` they read).
"""

from __future__ import annotations

import streamlit as st

from ui.common import Classes, Current, keep, label_defaults
from vitviz.models.load import LoadedModel


def session_target(ranked: Classes):
    """The session's target (class and "…minus" of Image & predictions) as a ``Target`` of ``ranked``: the class
    where ``ranked`` has it (else the top-1), the minus where it is another of ``ranked``'s (else none)."""
    known = {p.index for p in ranked.ranked}
    cls = st.session_state.class_index if st.session_state.class_index in known else ranked.ranked[0].index
    minus = st.session_state.class_minus if st.session_state.class_minus in known - {cls} else None
    return ranked.target(cls, minus)


def target_ui(ranked: Classes, *, key: str, start=None):
    """The explained target: a class (or zero-shot label), optionally minus another; a ``Target``.

    ``ranked``: :func:`ui.common.classes` of the image explained; ``start``: the ``Target`` first shown
    (default: the top-1 alone).
    """
    names = {p.index: p.label for p in ranked.ranked}
    order = [p.index for p in ranked.ranked]
    first = start.index if start is not None and start.index in names else order[0]
    default_minus = None if start is None else start.minus
    what = "Label" if ranked.labels is not None else "Class"
    c1, c2 = st.columns(2)
    index = c1.selectbox(what, order, index=order.index(first), format_func=names.get, key=f"{key}_index")
    others = [None, *(i for i in order if i != index)]
    minus = c2.selectbox(
        f"…minus {what.lower()}",
        others,
        index=others.index(default_minus) if default_minus in others else 0,
        format_func=lambda i: "(none)" if i is None else names[i],
        key=f"{key}_minus",
        help=f"Explain the difference of two scores: {what.lower()} A's minus {what.lower()} B's (before softmax).",
    )
    return ranked.target(index, None if minus == index else minus)


def labels_text(model: LoadedModel) -> tuple[str, str]:
    """The session's labels text and prompt template for a zero-shot model (the model's suggestions by default)."""
    return label_defaults(model, st.session_state.labels_text, st.session_state.template)


def _labels_edited(key: str) -> None:
    """A labels box (sidebar or page) changed: it becomes the session's labels, and the class its top-1."""
    ss = st.session_state
    ss.labels_text, ss.template, ss.class_index = ss[f"labels_{key}"], ss[f"template_{key}"], None


def labels_ui(model: LoadedModel, *, key: str, sidebar: bool = False) -> None:
    """An editable labels box and prompt template for a zero-shot model, drawn where it is called.

    Every box (the sidebar's, a page's) shows the session's ``labels_text`` / ``template`` and writes
    them when edited, so all stay in step. Widget keys: ``labels_<key>``, ``template_<key>``; a page's box
    is labelled apart from the sidebar's (``sidebar``). Nothing is drawn for other models. Notes on what
    was typed are the sidebar's (drawn once).
    """
    from vitviz.models.zeroshot import MAX_LABELS_TEXT, MAX_TEMPLATE_CHARS

    if not getattr(model, "zero_shot", False) or model.text is None:
        return
    ss = st.session_state
    text, template = labels_text(model)
    # the browser stops typing at the cap; the parser caps what arrives all the same
    ss[f"labels_{key}"], ss[f"template_{key}"] = text[:MAX_LABELS_TEXT], template[:MAX_TEMPLATE_CHARS]
    st.text_area(
        "One per line, or separated by commas" if sidebar else "Labels, one per line or separated by commas",
        key=f"labels_{key}",
        height=90,
        max_chars=MAX_LABELS_TEXT,
        on_change=_labels_edited,
        args=(key,),
    )
    st.text_input(
        "Prompt template ({} is the label)" if sidebar else "Labels' prompt template ({} is the label)",
        key=f"template_{key}",
        max_chars=MAX_TEMPLATE_CHARS,
        on_change=_labels_edited,
        args=(key,),
    )


def forget_widgets_unless(owner, *keys: str) -> None:
    """Drop the widget state of ``keys`` when ``owner`` (what their values refer to: the model, its labels, the
    session's class) is no longer what it was when they were last drawn: class and label indices mean
    other things after such a change."""
    ss = st.session_state
    tag = f"_owner_{keys[0]}"
    if ss.get(tag) != owner:
        for k in keys:
            ss.pop(k, None)
        ss[tag] = owner


def minus_ui(cur: Current, ranked: Classes, explained: int, container=st, **selectbox_kw) -> int | None:
    """The "…minus" box, bound to the session's ``class_minus`` (one value, on every page that draws it): the class
    or label whose score is subtracted from ``explained``'s; returns it, or None (none). A minus chosen for another
    model or another set of labels is dropped, and one equal to ``explained`` means none."""
    ss = st.session_state
    owner = (cur.key[0], None if ranked.labels is None else ranked.labels.prompts)
    if ss.get("_owner_class_minus") != owner:
        ss.class_minus, ss._owner_class_minus = None, owner
    options = [None, *(p.index for p in ranked.ranked if p.index != explained)]
    if ss.class_minus not in options:
        ss.class_minus = None
    names = {p.index: f"{p.label} ({p.probability:.1%})" for p in ranked.ranked}
    what = "label" if ranked.labels else "class"
    container.selectbox(
        selectbox_kw.pop("label", f"…minus {what}"),
        options,
        format_func=lambda i: "(none)" if i is None else names[i],
        help=f"Explain the difference of two scores: this {what}'s minus the other's (before softmax), "
        f"'{what} A rather than {what} B'. One choice for the Overview and Layers pages.",
        **selectbox_kw,
        **keep("class_minus"),
    )
    return ss.class_minus
