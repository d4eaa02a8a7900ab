"""Placeholder: the pvt adapters arrive with their tests."""

FAMILIES: tuple = ()
