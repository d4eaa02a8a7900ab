"""Training and scoring of the bundled demo models."""
