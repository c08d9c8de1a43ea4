"""The video options of [dataset] and [model] (docs/video.md): defined here once and mixed into those
sections (data_sections.py), shown only for the video families (families/registry.py VIDEO_FAMILIES)."""
from __future__ import annotations

from typing import Literal

from ..families.registry import AUDIO_FAMILIES, VIDEO_FAMILIES
from .base import F, Section

VIDEO = {"model.arch": VIDEO_FAMILIES}
AUDIO = {"model.arch": AUDIO_FAMILIES}   # models with an audio stream (LTX-2)
# the Wan 2.2 models with two experts (high-noise `transformer`, low-noise `transformer_2`)
TWO_EXPERT_FAMILIES = ("wan22_t2v", "wan22_i2v")
# the models that generate from text alone or from a start image (Family.given_frames): Wan 2.2 TI2V-5B
START_IMAGE_FAMILIES = ("wan22_ti2v",)


class VideoDatasetOptions(Section):
    """[dataset]'s clip options: how clips become training windows."""
    video_frames: int = F(33, "Frames per training window at most, rounded down to the model's frame rule (Wan: "
                              "4k+1, LTX-2: 8k+1). A clip shorter than this trains at the longest count it allows; "
                              "images are 1-frame clips.", ge=1, le=1025, resume="unsafe:samples", when=VIDEO)
    video_fps: float = F(16.0, "Frames are sampled from each clip at this rate (Wan 2.2 A14B is trained at 16 fps, "
                               "TI2V-5B and LTX-2 at 24); 0 = each clip's own rate.", ge=0.0, le=240.0, resume="unsafe:samples", when=VIDEO)
    video_clip_mode: Literal["head", "uniform", "random"] = F(
        "head", "Which window of a clip longer than video_frames trains: head = its start; uniform = windows "
                "spread evenly over the clip (each a sample; video_max_windows); random = a new start each epoch "
                "(fixed at the first draw while latents are cached). As diffusion-pipe's video_clip_mode.",
        resume="unsafe:samples", when=VIDEO)
    video_max_windows: int = F(0, "uniform mode: windows per clip at most; 0 = about one per window length of the "
                                  "clip.", ge=0, le=1000, advanced=True, resume="unsafe:samples", when=VIDEO)
    video_frame_buckets: list[int] = F([], "Frame buckets: the frame counts windows may have, e.g. [1, 17, 33]; "
                                           "each clip trains at the largest one it is long enough for (clips "
                                           "shorter than the smallest are skipped with a warning). Every count "
                                           "must follow the model's frame rule. Empty = any count the rule allows "
                                           "up to video_frames.", advanced=True, resume="unsafe:samples",
                                        when=VIDEO)
    video_sequence_fps: float = F(16.0, "The frame rate of an image-sequence clip (a <name>.frames folder of "
                                        "numbered images).", gt=0.0, le=240.0, advanced=True,
                                  resume="unsafe:samples", when=VIDEO)
    video_audio: bool = F(True, "Train the clips' audio tracks with their frames (models with an audio stream: "
                                "LTX-2): each window's audio, the same seconds as its frames, goes through the "
                                "model's audio VAE and the loss gets an audio term (loss.audio_loss_weight). Clips "
                                "without an audio track train video only; the plan says how many. Off: video only.",
                          resume="unsafe:samples", when=AUDIO)
    video_start_image_probability: float = F(
        0.0, "Wan 2.2 TI2V-5B is one model for text-to-video and image-to-video: the chance that a clip trains "
             "image-to-video, drawn for each clip at each step. Its first latent frame is then given clean, at "
             "timestep 0, with no loss on it, as the pipeline's image-to-video mode runs. 0 = text-to-video only; "
             "1 = image-to-video only. Images (1-frame clips) always train text-to-image.",
        ge=0.0, le=1.0, resume="safe", when={"model.arch": START_IMAGE_FAMILIES})


class VideoModelOptions(Section):
    """[model]'s options of the video families."""
    expert: Literal["high", "low", "both"] = F(
        "high", "Wan 2.2 A14B has two experts: high (`transformer`, the noisy first steps: layout and motion) and "
                "low (`transformer_2`, the last steps: detail and likeness). Each trains only over its own "
                "timestep range (boundary_ratio); both = each step's timestep picks the expert it trains, and "
                "each expert's LoRA is written to its own file.", resume="unsafe:modules",
        when={"model.arch": TWO_EXPERT_FAMILIES})
