"""A WD14-style tagger through onnxruntime: SmilingWolf's wd-*-tagger-v3 layout (model.onnx taking
NHWC BGR pixels 0-255 at the size its input declares, one sigmoid per tag; selected_tags.csv with
each tag's category: 9 rating, 0 general, 4 character). Character tags first, then general tags by
confidence; ratings are not written. On a GPU when onnxruntime has the CUDA provider, else the CPU."""
from __future__ import annotations

import csv
from pathlib import Path

from ..errors import ConfigError

GENERAL, CHARACTER, RATING = 0, 4, 9
GENERAL_THRESHOLD = 0.35     # the thresholds SmilingWolf's own demo uses
CHARACTER_THRESHOLD = 0.85
SHORT_TAGS = 15              # a "short" caption: the most confident general tags only


# tags that are faces, not words: their underscores stay (the list SmilingWolf's own demo keeps)
KAOMOJI = frozenset({"0_0", "(o)_(o)", "+_+", "+_-", "._.", "<o>_<o>", "<|>_<|>", "=_=", ">_<", "3_3", "6_9", ">_o",
                     "@_@", "^_^", "o_o", "u_u", "x_x", "|_|", "||_||"})


def tag_name(name: str) -> str:
    """Underscores become spaces ("long_hair" -> "long hair"); kaomoji stay ("^_^", "o_o")."""
    return name if name in KAOMOJI else name.replace("_", " ")


def read_tags(path: Path) -> list[tuple[str, int]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [(row["name"], int(row["category"])) for row in csv.DictReader(f)]
    except (OSError, KeyError, ValueError) as e:
        raise ConfigError(f"--model: {path} is not a tagger's tag list (tag_id,name,category,count): {e}") from None


def pick_tags(probs, tags: list[tuple[str, int]], length: str) -> str:
    """One image's probabilities -> "character, general, …" (comma-separated)."""
    chars = [(p, n) for p, (n, c) in zip(probs, tags) if c == CHARACTER and p >= CHARACTER_THRESHOLD]
    general = [(p, n) for p, (n, c) in zip(probs, tags) if c == GENERAL and p >= GENERAL_THRESHOLD]
    general.sort(key=lambda t: -t[0])
    if length == "short":
        general = general[:SHORT_TAGS]
    return ", ".join(tag_name(n) for _, n in sorted(chars, key=lambda t: -t[0]) + general)


class OnnxTagger:
    def __init__(self, folder: Path, device: str = "auto"):
        import onnxruntime as ort
        available = ort.get_available_providers()
        providers = (["CUDAExecutionProvider"] if device != "cpu" and "CUDAExecutionProvider" in available else [])
        from ..compute.devices import is_cuda
        if device != "auto" and is_cuda(device) and not providers:
            raise ConfigError(f"--device {device}: this onnxruntime has no CUDA provider (install onnxruntime-gpu)")
        self.session = ort.InferenceSession(str(Path(folder) / "model.onnx"), providers=providers +
                                            ["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0]
        self.size = int(self.input.shape[1]) if isinstance(self.input.shape[1], int) else 448
        self.tags = read_tags(Path(folder) / "selected_tags.csv")
        outputs = self.session.get_outputs()[0].shape[-1]
        if isinstance(outputs, int) and outputs != len(self.tags):
            raise ConfigError(f"--model: {folder}: model.onnx gives {outputs} scores but selected_tags.csv "
                              f"lists {len(self.tags)} tags")

    def pixels(self, image):
        """Pad to a white square, resize to the model's side, RGB -> BGR float32 0-255 (as it was trained)."""
        import numpy as np
        from PIL import Image
        side = max(image.size)
        square = Image.new("RGB", (side, side), (255, 255, 255))
        square.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
        square = square.resize((self.size, self.size), Image.BICUBIC)
        return np.asarray(square, dtype=np.float32)[:, :, ::-1]

    def caption(self, images: list, length: str) -> list[str]:
        import numpy as np
        batch = np.stack([self.pixels(img) for img in images])
        probs = self.session.run(None, {self.input.name: batch})[0]
        return [pick_tags(p, self.tags, length) for p in probs]
