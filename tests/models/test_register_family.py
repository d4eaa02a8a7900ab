"""``register_family``: an adapter written outside vitviz joins the registry that ``load_model`` reads."""

from __future__ import annotations

import pytest

import vitviz.models.families as families
from vitviz.errors import UnsupportedModelError
from vitviz.models.families import Family, family_for, register_family, supported_model_types
from vitviz.models.families.vit import PlainViT


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """Every test here leaves the registry as it found it."""
    monkeypatch.setattr(families, "_BY_TYPE", dict(families._BY_TYPE))
    monkeypatch.setattr(families, "FAMILIES", families.FAMILIES)


class _Config:
    def __init__(self, model_type: str) -> None:
        self.model_type = model_type


class Made(PlainViT):
    name = "Made-up"
    model_types = ("made_up", "made_up_v2")


def test_a_registered_family_is_found_for_each_of_its_types():
    with pytest.raises(UnsupportedModelError):
        family_for(_Config("made_up"))
    made = Made()
    register_family(made)
    assert family_for(_Config("made_up")) is made
    assert family_for(_Config("made_up_v2")) is made
    assert {"made_up", "made_up_v2"} <= set(supported_model_types())
    assert families.FAMILIES[-1] is made
    assert family_for(_Config("vit")).name == "ViT"  # the others are untouched


def test_registering_twice_lists_the_family_once():
    made = Made()
    register_family(made)
    register_family(made)
    assert sum(f is made for f in families.FAMILIES) == 1


def test_a_taken_type_is_refused_unless_replace():
    class Mine(PlainViT):
        name = "My ViT"
        model_types = ("vit",)

    mine = Mine()
    with pytest.raises(ValueError, match=r"vit \(ViT\).*replace=True"):
        register_family(mine)
    assert family_for(_Config("vit")).name == "ViT"
    register_family(mine, replace=True)
    assert family_for(_Config("vit")) is mine
    assert not any(f.name == "ViT" for f in families.FAMILIES)  # the replaced adapter names no type now


def test_bad_families_are_refused():
    with pytest.raises(TypeError, match="Family instance"):
        register_family(PlainViT)  # the class, not an instance

    class Nameless(Family):
        name = "nameless"

    with pytest.raises(ValueError, match="names no model_types"):
        register_family(Nameless())
