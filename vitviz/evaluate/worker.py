"""What each worker of a data-set evaluation needs: the settings it runs with and the code that scores one image.

:mod:`vitviz.evaluate.run` (the local engine and the driver) and :mod:`vitviz.evaluate.ray_engine` (its Ray
actors) both use these; neither imports the other's engine code from here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

from vitviz.analysis.stats import summary_table
from vitviz.capture.targets import Target
from vitviz.errors import VitvizError
from vitviz.evaluate.data import Item, Skipped, load_item, scale_box
from vitviz.evaluate.faithfulness import DEFAULT_INSERTION_START, Perturbations
from vitviz.evaluate.results import image_seed, make_rows
from vitviz.methods import get_method
from vitviz.methods.base import Inputs
from vitviz.models.load import LoadedModel, load_model
from vitviz.models.zeroshot import Labels

__all__ = ["EvaluateError", "RunConfig", "Evaluator", "failure"]


class EvaluateError(VitvizError):
    """A data set evaluation cannot start or go on; the message says why."""


@dataclass(frozen=True)
class RunConfig:
    """What each worker needs to evaluate images: plain values only (Ray ships it to its actors).

    ``model``: the name or path given to :func:`~vitviz.models.load.load_model` (each
    worker loads its own copy); ``methods``: names, in order; ``size``: the input size
    (None: the model's); ``batch_size``: perturbed images per forward.
    """

    model: str
    methods: tuple[str, ...]
    size: int | tuple[int, int] | None = None
    seed: int = 0
    batch_size: int = 20
    device: str | None = None
    insertion_start: str = DEFAULT_INSERTION_START
    relevance_from_block: int = 0  # relevance through blocks k..L-1 (0: all, MM-Explainability's start_layer=0)
    labels: tuple[str, ...] = ()  # zero-shot models: the labels each image is scored against (their texts)
    template: str = "{}"  # the prompt template the labels go into

    def to_dict(self) -> dict:
        d = asdict(self)
        d["methods"] = list(self.methods)
        d["labels"] = list(self.labels)
        d["size"] = list(self.size) if isinstance(self.size, tuple) else self.size
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        size = d.get("size")
        return cls(
            model=d["model"],
            methods=tuple(d["methods"]),
            size=tuple(size) if isinstance(size, list) else size,
            seed=int(d.get("seed", 0)),
            batch_size=int(d.get("batch_size", 20)),
            device=d.get("device"),
            insertion_start=d.get("insertion_start", "blur"),  # runs written before the choice used blur
            relevance_from_block=int(d.get("relevance_from_block", 0)),
            labels=tuple(d.get("labels", ())),
            template=d.get("template", "{}"),
        )

    def label_set(self) -> Labels | None:
        """The zero-shot labels as :class:`~vitviz.models.zeroshot.Labels` (None: the model's own classes)."""
        if not self.labels:
            return None
        prompts = tuple(self.template.replace("{}", name, 1) for name in self.labels)
        return Labels(self.labels, prompts, self.template)

    def method(self, name: str):
        """The method ``name`` with this run's options (relevance: ``from_block``)."""
        if name == "relevance" and self.relevance_from_block:
            return get_method(name, from_block=self.relevance_from_block)
        return get_method(name)


class Evaluator:
    """A loaded model and a :class:`RunConfig`: evaluates one image into its result rows (one per method)."""

    def __init__(self, config: RunConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        self.loaded = loaded if loaded is not None else load_model(config.model, device=config.device)
        self.labels = config.label_set()  # zero-shot: the labels are the classes (label targets of their scores)
        self.methods = [config.method(m) for m in config.methods]

    def evaluate_item(self, item: Item) -> list[dict]:
        """Read, check and evaluate one item (raises :class:`~vitviz.errors.VitvizError` for a bad image)."""
        return self.evaluate_image(item, load_item(item))

    def evaluate_image(self, item: Item, image: Image.Image) -> list[dict]:
        """The rows of one image already read (module docstring)."""
        cfg, loaded = self.config, self.loaded
        inputs = Inputs(loaded, image, size=cfg.size)
        cap = inputs.capture  # one capture: the prediction, the attention-based maps and the head summaries
        seed = image_seed(cfg.seed, item.image_id)
        pert = Perturbations(
            loaded,
            image,
            size=cfg.size,
            batch_size=cfg.batch_size,
            insertion_start=cfg.insertion_start,
            seed=seed,
            labels=self.labels,
        )
        target = self._predicted(inputs, pert)
        maps = {m.name: m(inputs, target=target, seed=seed) for m in self.methods}
        box = None if item.box is None else scale_box(item.box, image.size, pert.input_size)
        scored = pert.curves_many(list(maps.values()), target=target, box=box)
        return make_rows(
            image_id=item.image_id,
            path=item.path,
            label=item.label,
            image_wh=image.size,
            box=box,
            scored=dict(zip(maps, scored, strict=True)),
            model=loaded.name,
            input_hw=pert.input_size,
            seed=cfg.seed,
            seed_of_image=seed,
            head_distance=summary_table(cap.blocks, "distance"),
            head_entropy=summary_table(cap.blocks, "entropy"),
        )

    def _predicted(self, inputs: Inputs, pert: Perturbations) -> Target:
        """The image's top-1 class, or (zero-shot) its top label by the unperturbed scores."""
        if self.labels is None:
            return Target.of_class(inputs.predicted_class())
        return Target.of_label(self.labels, int(np.argmax(pert.original_probabilities)))


def failure(item: Item, exc: BaseException) -> Skipped:
    """How a failed image is reported: where it was listed, and the error (its type too when unexpected)."""
    where = item.path if not item.source or item.source == item.path else f"{item.source} ({item.image_id})"
    msg = str(exc) if isinstance(exc, VitvizError) else f"{type(exc).__name__}: {exc}"
    return Skipped(where, msg)
