"""What the AppTest modules share: the app, its pages, a model folder opened as a user would, the trouble check."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGES = (
    "pages/overview.py",
    "pages/heads.py",
    "pages/layers.py",
    "pages/importance.py",
    "pages/compare.py",
    "pages/positions.py",
    "pages/embedding.py",
    "pages/dataset.py",
)


def no_trouble(at: AppTest, where: str = "") -> None:
    """No exception and no ``st.error`` on the page drawn last."""
    assert not at.exception, (where, [e.value for e in at.exception])
    assert not at.error, (where, [e.value for e in at.error])


def open_folder(folder: str | Path, timeout: float = 180) -> AppTest:
    """The app with ``folder`` typed as the model in the sidebar ("other"), as a user would."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.run()
    at.selectbox(key="model_pick").set_value("other (hub id or local folder)…").run()
    at.text_input(key="model_text").input(str(folder)).run()
    return at


class ClickChart:
    """A clickable map (``ui/click_chart.py``, a custom component) read like ``st.plotly_chart``'s element:
    ``.proto.spec`` (the figure's JSON), ``.proto.id``, ``.proto.selection_mode`` and ``.proto.config``."""

    def __init__(self, element) -> None:
        import json

        data = json.loads(element.proto.json)[0]
        self.element, self.key, self.type = element, element.key, "click_chart"
        self.spec, self.id, self.config = data["spec"], element.proto.id, json.dumps(data["config"])
        self.selection_mode = ["points"]  # a click sets the state to the clicked point

    @property
    def proto(self) -> ClickChart:
        return self


def charts(at: AppTest) -> list:
    """Every Plotly figure on the page in page order: ``st.plotly_chart``'s elements and the clickable maps
    (``ClickChart``); each has ``.proto.spec``, the figure's JSON."""
    return [
        ClickChart(el) if el.type == "bidi_component" else el
        for el in at._tree
        if el.type == "plotly_chart"
        or (el.type == "bidi_component" and el.proto.component_name == "vitviz_click_chart")
    ]


def example_image(name: str):
    """The example gallery's image ``name`` as the app reads it."""
    from ui.common import EXAMPLES
    from vitviz.data.images import read_image

    return read_image((EXAMPLES / name).read_bytes()).image
