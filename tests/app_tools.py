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
