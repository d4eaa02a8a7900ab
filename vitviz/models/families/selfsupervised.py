"""Placeholder: the selfsupervised adapters arrive with their tests."""

FAMILIES: tuple = ()
