"""Placeholder: the cvt adapters arrive with their tests."""

FAMILIES: tuple = ()
