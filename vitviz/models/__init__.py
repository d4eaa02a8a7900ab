"""Loading models (``load``) and one adapter per model family (``families``)."""
