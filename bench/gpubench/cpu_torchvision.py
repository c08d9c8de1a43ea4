"""A stand-in for the few `torchvision.transforms` the diffusers DreamBooth examples use, for the
tiny CPU check only (bench/gpu.py run --tiny --device cpu).

Why: PyPI's torchvision wheel is a CUDA build; next to the dev machine's CPU torch its import fails
(`torchvision::nms does not exist`) and breaks diffusers (FIELD-NOTES.md), so it is not installed
there. observe.py hands these objects to the example script's own `import torchvision…` statements
only (through the `__import__` of the script's globals): no library sees them, nothing enters
sys.modules under torchvision's name, and a machine with the real torchvision (the GPU machine)
never uses this file. Resize, CenterCrop, RandomCrop (with get_params), RandomHorizontalFlip,
ToTensor, Normalize, Compose, InterpolationMode and functional.crop behave as torchvision's do on
PIL images.
"""
from __future__ import annotations

import builtins
import enum
import random
import types

import numpy as np
import torch
from PIL import Image


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


_PIL = {InterpolationMode.NEAREST: Image.NEAREST, InterpolationMode.NEAREST_EXACT: Image.NEAREST,
        InterpolationMode.BILINEAR: Image.BILINEAR, InterpolationMode.BICUBIC: Image.BICUBIC,
        InterpolationMode.BOX: Image.BOX, InterpolationMode.HAMMING: Image.HAMMING,
        InterpolationMode.LANCZOS: Image.LANCZOS}


def crop(img, top: int, left: int, height: int, width: int):
    return img.crop((left, top, left + width, top + height))


def _pair(size):
    return (size, size) if isinstance(size, int) else tuple(size)


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Resize:
    """An int resizes the shorter side to it (aspect kept), a pair resizes to (h, w)."""
    def __init__(self, size, interpolation=InterpolationMode.BILINEAR):
        self.size, self.interpolation = size, interpolation

    def __call__(self, img):
        w, h = img.size
        if isinstance(self.size, int):
            if w <= h:
                size = (self.size, int(self.size * h / w))
            else:
                size = (int(self.size * w / h), self.size)
        else:
            size = (self.size[1], self.size[0])
        return img.resize(size, _PIL[self.interpolation])


class CenterCrop:
    def __init__(self, size):
        self.size = _pair(size)

    def __call__(self, img):
        th, tw = self.size
        w, h = img.size
        return crop(img, int(round((h - th) / 2.0)), int(round((w - tw) / 2.0)), th, tw)


class RandomCrop:
    def __init__(self, size):
        self.size = _pair(size)

    @staticmethod
    def get_params(img, output_size):
        w, h = img.size
        th, tw = output_size
        return random.randint(0, h - th), random.randint(0, w - tw), th, tw

    def __call__(self, img):
        return crop(img, *self.get_params(img, self.size))


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, img):
        return img.transpose(Image.FLIP_LEFT_RIGHT) if random.random() < self.p else img


class ToTensor:
    """PIL (H, W, C) uint8 -> float tensor (C, H, W) in [0, 1]."""
    def __call__(self, img):
        array = np.asarray(img, dtype=np.uint8)
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div(255)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, tensor):
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return (tensor - mean) / std


def _modules() -> dict[str, types.ModuleType]:
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.crop = crop
    transforms = types.ModuleType("torchvision.transforms")
    for obj in (InterpolationMode, Compose, Resize, CenterCrop, RandomCrop, RandomHorizontalFlip, ToTensor,
                Normalize):
        setattr(transforms, obj.__name__, obj)
    transforms.functional = functional
    package = types.ModuleType("torchvision")
    package.transforms = transforms
    package.__version__ = "0.0+gpubench-cpu-stand-in"
    return {"torchvision": package, "torchvision.transforms": transforms,
            "torchvision.transforms.functional": functional}


def script_builtins() -> dict:
    """A builtins dict for a script's globals whose `__import__` answers torchvision imports with
    the stand-in and passes every other import to the real one."""
    modules = _modules()
    real_import = builtins.__import__

    def gated_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in modules:
            return modules[name] if fromlist else modules["torchvision"]
        return real_import(name, globals, locals, fromlist, level)

    table = dict(vars(builtins))
    table["__import__"] = gated_import
    return table
