"""One forward pass -> one immutable record of what the model did (``run``)."""
