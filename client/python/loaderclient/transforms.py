"""The daemon's image transforms under torchvision's names, for declared pipelines.

    from loaderclient.transforms import RandomResizedCrop, RandomHorizontalFlip, Normalize
    pipeline = [RandomResizedCrop(224), RandomHorizontalFlip(), Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    client.open(spec={"kind": "image_folder", "path": "/data/imagenet/train", "transforms": pipeline}, ...)

Each one is the entry of a dataset's `transforms:` list in the daemon's config (see the
README's image pipeline table): ``RandomResizedCrop(224).spec()`` is
``{"random_resized_crop": {"size": 224}}``. They run in the daemon, not here: nothing is
imported from torchvision, and their parameters are checked by the daemon with the
config's own messages ("spec.transforms[1].size: ..."). A pipeline's first step decodes:
Client.open and LoaderdDataLoader put a ``Decode()`` first when the list does not start
with one. Plain dicts in the config's shape are accepted wherever these are.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__all__ = ["Transform", "Decode", "Resize", "CenterCrop", "RandomResizedCrop", "RandomHorizontalFlip",
           "Normalize", "ToDtype", "Plugin", "IMAGENET_MEAN", "IMAGENET_STD", "to_specs"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Size = Union[int, Sequence[int]]


class Transform:
    """One step of the daemon's pipeline: `name` and its parameters."""
    name = ""

    def __init__(self, **params: Any) -> None:
        self.params = {k: v for k, v in params.items() if v is not None}

    def spec(self) -> Dict[str, Any]:
        return {self.name: dict(self.params)}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Transform) and self.spec() == other.spec()

    def __repr__(self) -> str:
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % kv for kv in self.params.items()))


def _size(size: Size) -> Dict[str, Any]:
    """torchvision's size: an int, or (height, width)."""
    if isinstance(size, int):
        return {"size": size}
    h, w = size
    return {"height": int(h), "width": int(w)}


class Decode(Transform):
    """JPEG or PNG to RGB uint8 (optional: max_pixels, strict, dct_scaling, fast)."""
    name = "decode"


class Resize(Transform):
    """An int resizes the shorter side to it (torchvision's Resize(int)); (h, w) resizes to that."""
    name = "resize"

    def __init__(self, size: Size) -> None:
        super().__init__(**_size(size))


class CenterCrop(Transform):
    name = "center_crop"

    def __init__(self, size: Size) -> None:
        super().__init__(**_size(size))


class RandomResizedCrop(Transform):
    """torchvision's RandomResizedCrop: scale (0.08, 1.0) and ratio (3/4, 4/3) by default."""
    name = "random_resized_crop"

    def __init__(self, size: Size, scale: Optional[Tuple[float, float]] = None,
                 ratio: Optional[Tuple[float, float]] = None) -> None:
        super().__init__(**_size(size), scale=list(scale) if scale is not None else None,
                         ratio=list(ratio) if ratio is not None else None)


class RandomHorizontalFlip(Transform):
    name = "random_flip"

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p=p)


class Normalize(Transform):
    """On the 0..1 scale, as torchvision after ToTensor: (v/255 - mean) / std; float32 CHW."""
    name = "normalize"

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__(mean=list(mean), std=list(std))


class ToDtype(Transform):
    """The field's dtype ("uint8", "float16", "float32") and layout ("CHW", "HWC")."""
    name = "to_dtype"

    def __init__(self, dtype: Optional[str] = None, layout: Optional[str] = None) -> None:
        super().__init__(dtype=dtype, layout=layout)


class Plugin(Transform):
    """A transform plug-in (a shared object): the daemon's access.declare must allow plug-ins."""
    name = "plugin"

    def __init__(self, path: str, params: Any = None) -> None:
        super().__init__(path=path, params=params)


def to_specs(transforms: Sequence[Union[Transform, Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """The list as the daemon reads it, with Decode() first when it is missing."""
    out = []
    for t in transforms:
        if isinstance(t, Transform):
            out.append(t.spec())
        elif isinstance(t, dict) and len(t) == 1:
            out.append(dict(t))
        else:
            raise TypeError("a transform is a loaderclient.transforms object or a one-key dict like "
                            "{'resize': {'size': 256}}, got %r" % (t,))
    if not out or next(iter(out[0])) != "decode":
        out.insert(0, {"decode": {}})
    return out
