"""Sparse-autoencoder features of a named point: the SAE (:mod:`vitviz.sae.model`), reading SAELens, ViT-Prisma and
saev checkpoints (:mod:`vitviz.sae.load`), features and edits on a Run (:mod:`vitviz.sae.run`), training
(:mod:`vitviz.sae.train`) and quality measures (:mod:`vitviz.sae.measure`)."""

from vitviz.sae.load import load_sae
from vitviz.sae.model import SAEConfig, SAEError, SparseAutoencoder, save_sae

__all__ = ["SAEConfig", "SAEError", "SparseAutoencoder", "load_sae", "save_sae"]
