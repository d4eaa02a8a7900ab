"""Sparse-autoencoder features of a named point: the SAE (:mod:`vitviz.sae.model`), reading SAELens, ViT-Prisma and
saev checkpoints (:mod:`vitviz.sae.load`), features and edits on a Run (:mod:`vitviz.sae.run`), training
(:mod:`vitviz.sae.train`), quality measures (:mod:`vitviz.sae.measure`), an index of every feature's top examples
over a data set (:mod:`vitviz.sae.index`) and the feature card's direct effects (:mod:`vitviz.sae.card`)."""

from vitviz.sae.load import load_sae
from vitviz.sae.model import SAEConfig, SAEError, SparseAutoencoder, save_sae

__all__ = ["SAEConfig", "SAEError", "SparseAutoencoder", "load_sae", "save_sae"]
