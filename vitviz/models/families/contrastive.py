"""Placeholder: the contrastive adapters arrive with their tests."""

FAMILIES: tuple = ()
