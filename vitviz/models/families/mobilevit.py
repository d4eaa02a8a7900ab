"""Placeholder: the mobilevit adapters arrive with their tests."""

FAMILIES: tuple = ()
