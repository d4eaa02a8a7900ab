"""Data coming in: image intake (``images``) and the synthetic shapes of the demo models (``shapes``)."""
