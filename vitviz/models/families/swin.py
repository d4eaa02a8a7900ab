"""Placeholder: the swin adapters arrive with their tests."""

FAMILIES: tuple = ()
