"""Explanation methods behind one interface: ``explain(loaded, image, method, *, target) -> MethodMap``.

Every method gives one raw map on the first stage's grid (the patch grid of a plain
ViT), so that maps can be compared cell by cell and scored by the faithfulness
curves (:mod:`vitviz.evaluate.faithfulness`). One module per method:

========================  ==================================================================
``attention``             last block's raw attention from its global query, head mean
``rollout``               attention rollout of the readout row (Abnar & Zuidema 2020)
``relevance``             class-specific relevance (Chefer, Gur & Wolf 2021)
``gradcam``               Grad-CAM on the tokens entering the last attention block (``layer="cnn"``:
                          on the last CNN stage of a hybrid ViT)
``integrated_gradients``  Integrated Gradients from the mean image (captum's rule), pooled per cell
``attnlrp``               AttnLRP (Achtibat et al. 2024): LRP rules as gradient x input, pooled per cell
``random``                i.i.d. uniform values from a seeded generator (the floor)
========================  ==================================================================

Named variants (:data:`VARIANTS`) are methods with other settings under a name of their own:
``attnlrp_cp`` is AttnLRP with CP-LRP inside attention (the attention matrix a constant, as
``lxt`` explains vision transformers), beside ``attnlrp``, the paper's rules (the default).
They are offered where methods are chosen by name (``--methods``, the app's Compare page) and
are not among the defaults (:data:`METHODS`, what applies when no method is named).

Rollout and relevance are undefined for MobileViT (``Family.rollout_note``); class-
specific methods need a classifier. :func:`available_methods` lists what applies,
:func:`why_unavailable` says why not, and :func:`explain` raises :class:`MethodError`
with that reason. A method written outside vitviz joins them with :func:`register_method`
(docs/extending/method.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PIL import Image

from vitviz.capture.targets import Target, TargetError
from vitviz.methods.attention import Attention
from vitviz.methods.attnlrp import AttnLRP
from vitviz.methods.base import Inputs, Method, MethodError, MethodMap, place_on_grid, pool_to_grid
from vitviz.methods.gradcam import GradCam
from vitviz.methods.integrated_gradients import IntegratedGradients
from vitviz.methods.random_map import RandomMap
from vitviz.methods.relevance import Relevance
from vitviz.methods.rollout import Rollout
from vitviz.models.load import LoadedModel

__all__ = [
    "METHODS",
    "VARIANTS",
    "Method",
    "MethodMap",
    "MethodError",
    "Inputs",
    "Target",
    "TargetError",
    "get_method",
    "register_method",
    "available_methods",
    "why_unavailable",
    "explain",
    "explain_many",
    "place_on_grid",
    "pool_to_grid",
]

METHODS: dict[str, Method] = {
    m.name: m for m in (Attention(), Rollout(), Relevance(), GradCam(), IntegratedGradients(), AttnLRP(), RandomMap())
}


def register_method(method: Method, *, replace: bool = False) -> None:
    """Add ``method`` (an instance of a :class:`Method` subclass) to :data:`METHODS` under its ``name``.

    From then on :func:`get_method`, :func:`explain`, :func:`explain_many` and :func:`available_methods`
    (so the *Compare explanations* page and ``evaluate`` in this process) know it. A name that is taken is
    refused unless ``replace`` (so a typo cannot silently take over ``rollout``). Process-wide; Ray's
    workers are other processes and do not see it.

    Raises:
        TypeError: ``method`` is not a :class:`Method` instance.
        ValueError: its ``name`` is unset or taken (without ``replace``).
    """
    if not isinstance(method, Method):
        raise TypeError(f"register_method takes a Method instance, got {type(method).__name__}")
    name = method.name
    if not isinstance(name, str) or not name or name == Method.name:
        raise ValueError(f"{type(method).__name__} has no name: set the class attribute `name`")
    if name in METHODS and METHODS[name] is not method and not replace:
        raise ValueError(f"an explanation method named {name!r} exists; pass replace=True to take its place")
    if name in VARIANTS and not replace:
        raise ValueError(f"{name!r} names a variant of {VARIANTS[name][0]!r}; pass replace=True to take its place")
    METHODS[name] = method


# name -> (the method it varies, its constructor's settings): see the module docstring
VARIANTS: dict[str, tuple[str, dict]] = {"attnlrp_cp": ("attnlrp", {"variant": "cp"})}


def get_method(method: str | Method, **options) -> Method:
    """A method by name (:data:`METHODS` or :data:`VARIANTS`; with ``options`` for its constructor, e.g.
    ``n_steps=64``), or the instance given."""
    if isinstance(method, Method):
        if options:
            raise ValueError("options apply to a method given by name; configure an instance yourself")
        return method
    if method in METHODS:  # first: a method registered in a variant's place (replace=True) takes it
        return type(METHODS[method])(**options) if options else METHODS[method]
    if method in VARIANTS:
        base, fixed = VARIANTS[method]
        return type(METHODS[base])(**fixed, **options)
    raise MethodError(f"unknown explanation method {method!r}; choose one of {', '.join([*METHODS, *VARIANTS])}")


def why_unavailable(loaded: LoadedModel, method: str | Method, target: Target | None = None) -> str:
    """Why ``method`` does not apply to ``loaded`` (for ``target``) ("" when it does)."""
    return get_method(method).unavailable(loaded, target)


def available_methods(loaded: LoadedModel, target: Target | None = None) -> tuple[str, ...]:
    """Names of the methods that apply to ``loaded`` (for ``target``), in :data:`METHODS` order."""
    return tuple(name for name, m in METHODS.items() if not m.unavailable(loaded, target))


def explain(
    loaded: LoadedModel,
    image: Image.Image,
    method: str | Method,
    *,
    target: Target | int | None = None,
    size: int | tuple[int, int] | None = None,
    seed: int = 0,
    **options,
) -> MethodMap:
    """One method's map of ``image`` for ``target`` (a :class:`Target` or a class index; None: the predicted
    class).

    ``size``: the input size (default: the model's). ``seed``: for ``random``.
    ``options``: the method's constructor options (``integrated_gradients``: ``n_steps``,
    ``batch_size``). Raises :class:`MethodError` when the method does not apply.
    """
    m = get_method(method, **options)
    return m(Inputs(loaded, image, size=size), target=target, seed=seed)


def explain_many(
    loaded: LoadedModel,
    image: Image.Image,
    methods: Sequence[str | Method] | None = None,
    *,
    target: Target | int | None = None,
    size: int | tuple[int, int] | None = None,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, MethodMap]:
    """Several methods on one image (default: every available one), sharing one capture and one target.

    ``target`` None: the predicted class, resolved once so that every map explains the same class. Raises :class:`MethodError` for a method that does not apply.
    ``progress(done, total, name)`` is called before each method (``name`` the one starting) and
    once at the end (``done == total``, ``name`` "").
    """
    given = target
    t = given if isinstance(given, Target) else None
    chosen = [get_method(m) for m in (available_methods(loaded, t) if methods is None else methods)]
    inputs = Inputs(loaded, image, size=size)
    if any(m.uses_capture for m in chosen):
        inputs.capture  # noqa: B018 - one capture serves the prediction and every attention-based map
    if given is None:
        given = inputs.predicted_class()
    out = {}
    for k, m in enumerate(chosen):
        if progress is not None:
            progress(k, len(chosen), m.name)
        out[m.name] = m(inputs, target=given, seed=seed)
    if progress is not None:
        progress(len(chosen), len(chosen), "")
    return out
