"""Video samples: an mp4 with its frame strip, listed by a sample event, plays as a video in the Run page's
gallery (inside the served roots) and shows as its frame strip outside them."""
from __future__ import annotations

from pathlib import Path

import gradio as gr
import numpy as np

from gui.run_monitor import sample_images
from gui.run_page import _gallery_update
from gui.run_state import fold_events
from trainer_backend.data.video import probe_clip, write_sample


def test_a_video_sample_plays_in_the_gallery_with_its_strip(tmp_path):
    run = tmp_path / "run"
    frames = np.zeros((9, 32, 32, 3), np.uint8)
    frames[..., 0] = (np.arange(9) * 28)[:, None, None]
    clip, strip = write_sample(run / "samples" / "step10-0", frames, fps=16)
    assert (probe_clip(clip).frames, clip.suffix, strip.name) == (9, ".mp4", "step10-0.strip.png")
    snap = fold_events([{"event": "sample", "step": 10, "paths": ["samples/step10-0.mp4", "samples/step10-0.strip.png"],
                         "prompts": ["a red square", "a red square"]}])
    items = sample_images(run, snap)
    assert [Path(p).name for p, _ in items] == ["step10-0.mp4", "step10-0.strip.png"]
    shown = gr.Gallery().postprocess(_gallery_update(items, [tmp_path.resolve()])["value"]).root
    assert type(shown[0]).__name__ == "GalleryVideo" and shown[0].video.mime_type == "video/mp4"
    assert type(shown[1]).__name__ == "GalleryImage"
    outside = _gallery_update(items, [tmp_path / "elsewhere"])["value"]   # not served: the strip, as a picture
    strip_image = outside[0][0]
    assert strip_image.size[1] == 96 and strip_image.size[0] == 8 * 96  # 8 of the 9 frames, 96x96 each
    (run / "samples" / "step10-0.mp4").write_bytes(b"half written")
    assert len(_gallery_update(items, [tmp_path / "elsewhere"])["value"]) == 1  # a broken clip is left out
