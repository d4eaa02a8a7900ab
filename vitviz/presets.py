"""The app's presets as data: the models offered in the sidebar and what the app says about the demo models.

No Streamlit and no torch: the app (``ui/common.py``), a notebook or a test read the same lists.
"""

from __future__ import annotations

from vitviz.demo import bundled

__all__ = ["PRESETS", "DEMO_NOTES"]

PRESETS = (
    *bundled(),  # demo, demo-swin, demo-clip: work with no network
    "google/vit-base-patch16-224",
    "facebook/deit-small-distilled-patch16-224",
    "facebook/dino-vits8",
    "facebook/dinov2-small",
    "facebook/dinov2-with-registers-small",
    "microsoft/swin-tiny-patch4-window7-224",
    "microsoft/swinv2-tiny-patch4-window8-256",
    "Zetatech/pvt-tiny-224",
    "OpenGVLab/pvt_v2_b0",
    "microsoft/cvt-13",
    "apple/mobilevit-small",
    "apple/mobilevitv2-1.0-imagenet1k-256",
    "facebook/hiera-base-224-in1k-hf",
    "openai/clip-vit-base-patch32",
    "openai/clip-vit-base-patch16",
    "google/siglip-base-patch16-224",
    "google/siglip2-base-patch16-224",
    "google/siglip2-base-patch16-naflex",
    "facebook/dinov3-vits16-pretrain-lvd1689m",
    "facebook/vit-mae-base",
    "facebook/ijepa_vith14_1k",
    "apple/aimv2-large-patch14-224",
    "facebook/data2vec-vision-base-ft1k",
    "facebook/vit-msn-small",
)
_SHAPES = "circles, squares, triangles, crosses and stars"
DEMO_NOTES = {  # shown where a demo model is chosen: what it was trained on, and what a photo then shows
    "demo": f"The demo ViT was trained on synthetic shapes ({_SHAPES}): on a photo it shows where a shape "
    "detector looks, not what a photo model sees.",
    "demo-swin": f"The demo Swin was trained on synthetic shapes ({_SHAPES}): on a photo it shows where a shape "
    "detector looks, not what a photo model sees.",
    "demo-clip": f"The demo CLIP was trained on synthetic shapes ({_SHAPES}) and their names: on a photo it shows "
    "where a shape detector looks; labels are best chosen among the shapes' names.",
}
