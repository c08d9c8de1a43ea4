"""Sections: where the run goes, the base model, the dataset."""
from __future__ import annotations

from typing import ClassVar, Literal

from ..families.registry import (ARCH_CHOICES, BUILTIN_TINY, CLIP_SKIP_FAMILIES, CONTROL_FAMILIES, DDPM_FAMILIES,
                                 FLOW_FAMILIES, LORA_LAYOUT_CHOICE_FAMILIES, LORA_LAYOUTS)
from .base import F, Section
from .video_sections import VideoDatasetOptions, VideoModelOptions

METADATA = {"dataset.source": ("metadata",)}  # options of the metadata (JSON) mode
CONTROL = {"model.arch": CONTROL_FAMILIES}    # families that take paired control images (edit models)
TE_QUANT_KINDS = ("none", "int8", "float8", "nf4")  # storage kinds: compute/quantize.py
QUANT_KINDS = (*TE_QUANT_KINDS, "int8_compute", "float8_compute")  # + 8-bit matmuls: compute/lowbit_linear.py
# Paired control images: a control_path is where the files live (resume "ignored", like dataset.path); a
# resume still refuses changed control images, because run/resume.py's dataset fingerprint covers each pair.
CONTROL_HELP = ("Folder of control (reference) images for edit models, one per training image, matched by file "
                "stem in the same relative sub-folder (photos/cat.jpg <-> <control_path>/photos/cat.png); the pair "
                "is bucketed (by the training image), cropped, flipped and cached together. Models that take several "
                "reference images (Qwen-Image-Edit-2509/2511, Krea 2: up to 3): cat_0.png, cat_1.png, … numbered "
                "from 0 (cat.png alone = one reference). An image without its control image (or with a gap in the "
                "numbers) is skipped (one warning) by an edit-only model; Qwen-Image 2.1, Flux.2 and Krea 2 train "
                "it on its caption alone. Empty = no control images.")


class Output(Section):
    """Where the run directory goes."""
    TAB: ClassVar[str] = "Model"
    dir: str = F("runs", "Folder that holds run directories.", widget="path", resume="ignored")
    name: str = F("my-lora", "Run name; the run directory is <dir>/<name> and the output file <name>.safetensors.",
                  min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]*$", resume="ignored")
    lora_format: Literal[("auto", *LORA_LAYOUTS)] = F(
        "auto", "Flux, Chroma, Flux.2, SD3, Z-Image and Qwen-Image only: the LoRA file's key layout. auto = the "
                "family's own (SD1/SD2/SDXL kohya/webui; SD3, Flux, Chroma, Z-Image and Qwen-Image diffusers' "
                "transformer.…lora_A/lora_B, read by diffusers and ComfyUI; Flux.2 kohya). kohya = kohya's layout on "
                "the original modules (lora_down/lora_up/.alpha): Flux's lora_unet_double_blocks_… (q/k/v fused), "
                "read by kohya's sd-scripts, ComfyUI, Forge and diffusers (Chroma's: the same names, read by "
                "diffusers); SD3's lora_unet_joint_blocks_… (q/k/v "
                "fused), read by kohya's sd-scripts, ComfyUI and Forge (diffusers has no converter for it); Flux.2's, "
                "read by ComfyUI and diffusers; Z-Image's musubi-tuner names (lora_unet_layers_…_attention_to_q), read by "
                "musubi-tuner and diffusers (ComfyUI after musubi's convert_z_image_lora_to_comfy); Qwen-Image's "
                "lora_unet_transformer_blocks_…, read by ComfyUI and musubi-tuner. original (Z-Image) = the original "
                "checkpoint's names (lora_unet_layers_…_attention_qkv, q/k/v fused), read by ComfyUI and diffusers; "
                "Qwen-Image 2.1's: ComfyUI's diffusion_model.… with gate and up joined on img_mlp.gate_up; Krea 2's and "
                "Ideogram 4's: their original checkpoints' names (docs/models.md).",
        advanced=True, resume="safe",
        when={"model.arch": LORA_LAYOUT_CHOICE_FAMILIES})


class _ModelFields(Section):
    TAB: ClassVar[str] = "Model"
    path: str = F("", "Diffusers folder, single-file .safetensors checkpoint, a Hugging Face hub repo "
                      "(org/name, org/name@revision, or one file: org/name/file.safetensors; downloaded once into "
                      "the Hugging Face cache, docs/models.md), or builtin:tiny-<family> "
                      "(" + ", ".join(f"builtin:{n}" for n in BUILTIN_TINY) + "). Every other model file field "
                      "takes a hub repo or file too.", widget="path",
                      resume="ignored")
    hub_download: bool = F(True, "Download hub repos named in the model fields that are not in the Hugging Face "
                                 "cache yet. Off = offline: hub ids come from the cache only and local paths "
                                 "work as always (HF_HUB_OFFLINE=1 does the same).", advanced=True,
                           resume="ignored")
    hub_token_name: str = F("HF_TOKEN", "Name of the secret (environment variable, the studio's Secrets panel or "
                                        "a cloud.secrets_file line) holding a Hugging Face token, for gated and "
                                        "private repos; the value never enters the config or the logs.",
                            advanced=True, pattern=r"^([A-Za-z_][A-Za-z0-9_.-]*)?$", resume="ignored")
    arch: Literal[ARCH_CHOICES] = F("auto", "Model family; auto detects it from the model.", resume="unsafe:arch")
    vae: str = F("", "Optional VAE to use instead of the model's own (diffusers folder or file).",
                 widget="path", advanced=True, resume="ignored")
    prediction_type: Literal["auto", "epsilon", "v_prediction"] = F(
        "auto", "What the UNet predicts; auto reads the model's scheduler config (SD2-768 is v_prediction).",
        advanced=True, resume="unsafe:prediction",
                                                                    when={"model.arch": DDPM_FAMILIES})
    tokenizer: str = F("", "Tokenizers for a single-file checkpoint that carries none. SD: a diffusers model folder of "
                           "any SD family, or a folder with vocab.json + merges.txt. Flux: a Flux diffusers folder "
                           "(tokenizer/ and tokenizer_2/). SD3: an SD3 diffusers folder (tokenizer/, tokenizer_2/, "
                           "tokenizer_3/). Z-Image: a Z-Image diffusers folder (tokenizer/) or a Qwen3 "
                           "tokenizer folder. Flux.2: a Flux.2 diffusers folder or a Qwen3 tokenizer folder (dev: "
                           "a FLUX.2-dev diffusers folder or its tokenizer folder). "
                           "Qwen-Image: a Qwen-Image diffusers folder (tokenizer/; the edit model: processor/). Empty = "
                           "look in the Hugging Face cache (offline).",
                       widget="path", advanced=True, resume="ignored",
                       when={"model.arch": (*DDPM_FAMILIES, "sd3", "flux", "zimage", "flux2", "qwen_image",
                                          "qwen_image_edit")})
    clip_l: str = F("", "Flux or SD3 single file: the CLIP-L text encoder file (ComfyUI's "
                        "models/clip/clip_l.safetensors); model.path is the transformer (flux1-dev.safetensors, "
                        "sd3.5_large.safetensors) and model.vae the autoencoder (Flux: ae.safetensors; SD3: inside "
                        "model.path). For SD3, empty = the CLIP-L inside model.path (text_encoders.clip_l).",
                    widget="path", resume="ignored", when={"model.arch": ("sd3", "flux")})
    clip_g: str = F("", "SD3 single file only: the CLIP-G text encoder file (ComfyUI's "
                        "models/clip/clip_g.safetensors); empty = the CLIP-G inside model.path (text_encoders.clip_g).",
                    widget="path", resume="ignored", when={"model.arch": ("sd3",)})
    t5: str = F("", "Flux or SD3 single file: the T5-XXL text encoder file (ComfyUI's "
                    "models/clip/t5xxl_fp16.safetensors). SD3: empty = the T5 inside model.path, else none (SD3 "
                    "trains without T5: zeros in its place, less memory).",
                widget="path", resume="ignored", when={"model.arch": ("sd3", "flux")})
    text_encoder: str = F("", "Z-Image, Flux.2 or Qwen-Image single file: the text encoder file (ComfyUI's "
                              "models/text_encoders/: Z-Image qwen_3_4b.safetensors; Flux.2 Klein 4B "
                              "qwen_3_4b.safetensors, 9B qwen_3_8b.safetensors, dev "
                              "mistral_3_small_flux2_bf16.safetensors or its fp8 file; Qwen-Image "
                              "qwen_2.5_vl_7b.safetensors); model.path is the transformer (z_image_turbo_bf16, "
                              "flux-2-klein-base-4b, flux2-dev, qwen_image_bf16 .safetensors) and model.vae the autoencoder "
                              "(Z-Image: FLUX.1's ae.safetensors; flux2-vae.safetensors; qwen_image_vae.safetensors).",
                          widget="path", resume="ignored",
                          when={"model.arch": ("zimage", "flux2", "qwen_image", "qwen_image_edit")})
    guidance: float = F(1.0, "Flux.1 dev and Flux.2 dev only: the distilled guidance value the transformer is "
                             "given while training (1.0 as kohya and ai-toolkit train; samples use their own "
                             "cfg_scale).", ge=0.0, le=100.0, advanced=True, resume="safe",
                        when={"model.arch": ("flux", "flux2")})
    clip_skip: int = F(1, "Text conditioning from the CLIP layer this far from the end, through the final layer "
                          "norm, as kohya's sd-scripts and A1111 do: 1 = the last layer (the model's own), 2 = the "
                          "penultimate (what NovelAI-descended anime SD1 models were trained with). Used for "
                          "training, samples and class images, and written to the LoRA file (ss_clip_skip). SDXL "
                          "already uses the penultimate layer by design and refuses values above 1.", ge=1, le=12,
                      resume="safe", when={"model.arch": CLIP_SKIP_FAMILIES})
    quantize: Literal[QUANT_KINDS] = F(
        "none", "Store the frozen UNet/transformer's linear layers quantized, for LoRA/LoHa/LoKr training of big "
                "models on small GPUs (QLoRA): int8 or float8 weight-only (torchao: ~1/2 of bf16, ~1/4 of fp32), nf4 "
                "(bitsandbytes 4-bit: ~1/4 of bf16). The adapters stay fp32 and the LoRA file is the same as without "
                "quantization; the loss differs slightly (the base is rounded). Refused for network.type = full "
                "(the UNet itself is trained). nf4 takes LoRA/DoRA adapters only. int8_compute / float8_compute also "
                "MULTIPLY in 8 bits (LoRA/DoRA only): each frozen linear layer's weight is stored int8 or float8 "
                "e4m3 with a scale per row, activations are scaled per row, and the matmul runs in torch._int_mm "
                "(int8) or torch._scaled_mm (float8); faster where the GPU's 8-bit matmuls are (float8 needs an "
                "H100/H200/L40S/RTX 40xx or newer and is refused on other CUDA cards), the loss a little further "
                "from the unquantized run's (docs/performance.md).",
        resume="safe")
    quantize_text_encoders: Literal[TE_QUANT_KINDS] = F(
        "none", "Store the frozen text encoders' linear layers quantized (as model.quantize). Refused when a full "
                "fine-tune trains them (network.train_text_encoder with network.type = full).",
        advanced=True, resume="safe")
    t5_max_length: int = F(0, "Flow-matching families only: T5 tokens per caption (Z-Image and Flux.2 Klein: Qwen3 "
                              "tokens; Flux.2 dev: Mistral tokens; Qwen-Image: Qwen2.5-VL tokens); 0 = the model's "
                              "own (Flux dev 512, schnell 256, Chroma 512, SD3 256, Z-Image 512, Flux.2 512, Qwen-Image 512, Wan 2.2 UMT5: 512).", ge=0, le=512,
                           advanced=True,
                           resume="safe",
                           when={"model.arch": FLOW_FAMILIES})


class DatasetSubset(Section):
    """One [[dataset.subsets]] entry: another folder with its own repeats, captions and augmentation.
    Options left at "inherit" (or -1 / "") take the value from [dataset]."""
    path: str = F("", "Folder of this subset (images + captions, or the root that metadata paths are relative to).",
                  widget="path", min_length=1, resume="ignored")
    control_path: str = F("", CONTROL_HELP + " Not inherited: each subset names its own folder.", widget="path",
                          resume="ignored", when=CONTROL)
    source: Literal["inherit", "folders", "metadata"] = F("inherit", "folders or metadata (JSON) mode.",
                                                          resume="ignored")
    metadata_path: str = F("", "Metadata JSON file or folder of JSON files; empty = search this subset's path.",
                           widget="path", resume="ignored")
    repeats: int = F(0, "Repeats; 0 = from an N_concept folder name, else dataset.repeats.", ge=0, le=10000,
                     resume="ignored")
    caption_extension: str = F("", "Caption file extension; empty = dataset.caption_extension.",
                               pattern=r"^(\.[A-Za-z0-9_]+)?$", resume="ignored")
    class_tokens: str = F("", "Caption for images without one; empty = the concept of an N_concept folder name.",
                          resume="ignored")
    flip: Literal["inherit", True, False] = F("inherit", "Random horizontal flip.", resume="ignored")
    center_crop: Literal["inherit", True, False] = F("inherit", "Center crop (false: random crop).", resume="ignored")
    caption_dropout: float = F(-1.0, "Probability of an empty caption; -1 = inherit.", ge=-1.0, le=1.0,
                               resume="ignored")
    shuffle_tags: Literal["inherit", True, False] = F("inherit", "Shuffle tags after the first keep_tokens.",
                                                      resume="ignored")
    keep_tokens: int = F(-1, "Leading tags kept in place; -1 = inherit.", ge=-1, le=1000, resume="ignored")
    tag_dropout: float = F(-1.0, "Probability of dropping each tag; -1 = inherit.", ge=-1.0, le=1.0, resume="ignored")
    mask_path: str = F("", "With loss.masked: this subset's mask folder (see dataset.mask_path); empty = "
                           "dataset.mask_path.", widget="path", resume="ignored")


class _DatasetFields(Section):
    TAB: ClassVar[str] = "Dataset"
    path: str = F("", "Folder of images with same-named caption files; kohya-style N_concept subfolders give repeats.",
                  widget="path", resume="ignored")
    control_path: str = F("", CONTROL_HELP + " Applies to dataset.path; each [[dataset.subsets]] entry has its own.",
                          widget="path", resume="ignored", when=CONTROL)
    source: Literal["folders", "metadata"] = F(
        "folders", "folders: images with caption files (flat or N_concept subfolders); metadata: per-image JSON files "
                   "with tags, score and path.", resume="safe")
    metadata_path: str = F("", "Metadata mode: a JSON file or a folder tree of JSON files; empty = search "
                              "dataset.path.",
                           widget="path", advanced=True, resume="ignored",
                           when=METADATA)
    subsets: list[DatasetSubset] = F([], "More folders, each with its own repeats, captions and augmentation "
                                         "([[dataset.subsets]] tables); used together with dataset.path.",
                                     widget="subsets", advanced=True, resume="ignored")
    resolution: int = F(512, "Training resolution (square side, or the target area's side when bucketing).",
                        ge=32, le=4096, multiple_of=8, resume="unsafe_if_bucketing:buckets")
    caption_extension: str = F(".txt", "Caption file extension.", pattern=r"^\.[A-Za-z0-9_]+$", resume="safe")
    max_token_length: Literal[75, 150, 225] = F(
        75, "Caption tokens the text encoder sees. 150/225 (kohya's max_token_length): the caption is split "
            "into 75-token chunks, each encoded in its own window and concatenated, as A1111 and ComfyUI do "
            "with long prompts.", advanced=True, resume="safe",
                                                when={"model.arch": DDPM_FAMILIES})
    repeats: int = F(1, "Repeats for images in a flat folder (N_concept folders carry their own).", ge=1, le=10000,
                     resume="safe")
    class_tokens: str = F("", "Caption for flat-folder images that have no caption file (N_concept folders use the "
                              "concept).", resume="safe")
    class_path: str = F("", "Class (regularization) images for prior preservation; empty = none.", widget="path",
                        resume="ignored")
    class_prompt: str = F("", "Caption for every class image; empty = their caption files or folder names.",
                          resume="safe")
    class_samples: int = F(0, "Class samples per epoch; 0 = as many as the instance samples (class images are "
                              "cycled if there are fewer).", ge=0, resume="unsafe:samples")
    num_class_images: int = F(0, "DreamBooth prior preservation: class images wanted. When class_path holds fewer "
                                 "(or is empty), the missing ones are generated with the base model from "
                                 "class_prompt before training, into a cache outside the dataset, and reused by "
                                 "later runs. 0 = never generate.", ge=0, le=100000, resume="safe")
    prior_loss_weight: float = F(1.0, "Weight of the prior-preservation loss (the class samples' loss).", ge=0.0,
                                 le=100.0, resume="safe")
    class_negative_prompt: str = F("", "Negative prompt used when generating class images.", advanced=True,
                                   resume="safe")
    class_generation_steps: int = F(30, "Sampling steps per generated class image.", ge=1, le=1000, advanced=True,
                                    resume="safe")
    class_guidance_scale: float = F(7.5, "CFG scale for generated class images.", ge=0.0, le=50.0, advanced=True,
                                    resume="safe")
    class_generation_batch_size: int = F(4, "Class images generated per batch.", ge=1, le=256, advanced=True,
                                         resume="safe")
    bucketing: bool = F(False, "Aspect-ratio bucketing: batches of same-shaped images near resolution² in area, "
                               "instead of square crops.", resume="unsafe:buckets")
    bucket_min_side: int = F(0, "Smallest bucket side; images whose shorter side is smaller are skipped. "
                                "0 = resolution/2.", ge=0, le=8192, multiple_of=8, advanced=True,
                                resume="unsafe_if_bucketing:buckets")
    bucket_max_side: int = F(0, "Largest bucket side; 0 = resolution×2.", ge=0, le=16384, multiple_of=8,
                             advanced=True, resume="unsafe_if_bucketing:buckets")
    bucket_step: int = F(64, "Bucket sides are multiples of this.", ge=8, le=512, multiple_of=8, advanced=True,
                         resume="unsafe_if_bucketing:buckets")
    bucket_no_upscale: bool = F(False, "Never upscale: small images get a smaller bucket of their own size.",
                                advanced=True, resume="unsafe_if_bucketing:buckets")
    flip: bool = F(False, "Random horizontal flip.", resume="safe")
    center_crop: bool = F(True, "Center crop (off: random crop).", advanced=True, resume="safe")
    caption_dropout: float = F(0.0, "Probability of training a sample with an empty caption.", ge=0.0, le=1.0,
                               advanced=True, resume="safe")
    shuffle_tags: bool = F(False, "Shuffle comma-separated tags (after the first keep_tokens).", advanced=True,
                           resume="safe")
    shuffle_tags_p: float = F(1.0, "Probability that a sample's tags are shuffled when shuffle_tags is on.",
                              ge=0.0, le=1.0, advanced=True, resume="safe")
    keep_tokens: int = F(0, "Leading tags kept in place when shuffling.", ge=0, advanced=True, resume="safe")
    tag_dropout: float = F(0.0, "Probability of dropping each tag (after the first keep_tokens).", ge=0.0, le=1.0,
                           advanced=True, resume="safe")
    caption_separator: str = F(",", "Separator between tags in caption files (for shuffle and tag dropout).",
                               min_length=1, advanced=True, resume="safe")
    ignore_tags: list[str] = F([], "Metadata mode: skip images that have any of these tags.", advanced=True,
                               resume="safe")
    remove_tags: list[str] = F([], "Metadata mode: tags removed from captions.", advanced=True, resume="safe")
    replace_tags: dict[str, str] = F({}, "Metadata mode: text replaced inside every tag, in order, e.g. "
                                         "{\" \" = \"_\", \"artist:\" = \"by=\"}.", widget="table", advanced=True,
                                         resume="safe")
    tag_separator: str = F(", ", "Metadata mode: separator used to join tags into the caption.", min_length=1,
                           advanced=True, resume="safe",
                           when=METADATA)
    abs_min_score: float = F(0.0, "Metadata mode: skip images whose score is below this; 0 = off.", advanced=True,
                             resume="safe",
                             when=METADATA)
    min_score: float = F(0.0, "Metadata mode: skip images whose score plus tag_bonus_scores is below this; 0 = off.",
                         advanced=True, resume="safe",
                         when=METADATA)
    tag_bonus_scores: dict[str, float] = F({}, "Metadata mode: score added per tag before the min_score check, "
                                               "e.g. {solo = 100, sketch = -75}.", widget="table", advanced=True,
                                               resume="safe",
                                           when=METADATA)
    score_tags: list[int] = F([], "Metadata mode: score thresholds; the highest one exceeded adds a tag, e.g. "
                                  "[800, 400] makes score 900 add scr800.", advanced=True, resume="safe")
    score_tag_prefix: str = F("scr", "Metadata mode: prefix of score tags.", advanced=True, resume="safe",
                              when=METADATA)
    validation_every_nth: int = F(0, "Hold out every Nth image (metadata record or file, sorted) for validation; "
                                     "0 = off.", ge=0, advanced=True, resume="safe")
    mask_path: str = F("", "With loss.masked: a folder of mask images matched to the training images by file "
                           "name stem (kohya's conditioning masks): white = train, black = ignore, grey in "
                           "between. Empty = each image's own alpha channel. An image without a mask trains "
                           "with full weight (one warning per folder). See docs/dataset.md.", widget="path",
                       resume="safe", when={"loss.masked": (True,)})
    alpha_background: Literal["white", "black", "gray"] = F(
        "white", "Background that transparent images are composited on.", advanced=True, resume="safe")
    max_image_megapixels: float = F(100.0, "Skip images larger than this (decompression-bomb guard).", gt=0.0,
                                    le=1000.0, advanced=True, resume="safe")
    verify_images: bool = F(True, "Decode every image while scanning so corrupt files are skipped before training "
                                  "starts (slower start on very large datasets).", advanced=True, resume="safe")
    cache_latents: bool = F(False, "Encode images with the VAE once and reuse the latents (turns off random crop/flip "
                                   "variety unless both flips are cached).", resume="safe")
    cache_auto: bool = F(True, "Cache the latents and the text-encoder outputs when nothing changes them from step "
                               "to step (no random crop, no flip unless cache_both_flips, no caption shuffle, "
                               "caption or tag dropout, frozen text encoders), even where cache_latents / "
                               "cache_text_encoder_outputs are off; the plan and the log say what was chosen and "
                               "why. Cached latents are the VAE's posterior mean (uncached: a fresh posterior sample "
                               "each step). Off: only what those two options ask.", resume="safe")
    cache_latents_to_disk: bool = F(False, "Keep cached latents on disk (reused by later runs) instead of in memory.",
                                    resume="safe")
    cache_dir: str = F("", "Cache folder (outside the dataset); empty = <output.dir>/.cache.", widget="path",
                       advanced=True, resume="safe")
    cache_both_flips: bool = F(True, "With flip and latent caching on, cache both orientations (2× encoding); "
                                     "off = flip is disabled while caching.", advanced=True, resume="safe")
    cache_text_encoder_outputs: bool = F(False, "Encode each caption once when the text encoders are frozen and "
                                                "captions are static (no shuffle/dropout).", advanced=True,
                                                resume="safe")
    # the cache pass runs before the denoiser is on the GPU; these set its peak (docs/memory.md, "The cache pass")
    latent_cache_batch_size: int = F(4, "Images the VAE encodes at once while latents are cached (same bucket). "
                                        "A 1024² image takes ~2.5 GiB in the fp32 VAE: 1 for 8–12 GB cards.",
                                     ge=1, le=64, advanced=True, resume="safe")
    text_cache_batch_size: int = F(16, "Captions the text encoders read at once while their outputs are cached. "
                                       "Large encoders (Qwen, T5-XXL) take 0.3–0.4 GiB a caption: lower it for "
                                       "small cards.", ge=1, le=256, advanced=True, resume="safe")
    num_workers: int = F(-1, "DataLoader worker processes; -1 = automatic: on a GPU, when images are decoded every "
                             "step (latents not cached), up to 4 per process, so decoding and resizing run beside "
                             "the GPU's work (a 1024² image costs ~40 ms a step in the training process); 0 "
                             "otherwise. The samples are the same with any count (each sample's random choices "
                             "are seeded by its index).", ge=-1, le=64, advanced=True, resume="safe")


# the video families' options follow the others (pydantic orders fields from the last base to the first)
class Model(VideoModelOptions, _ModelFields):
    """The base model."""
    TAB: ClassVar[str] = "Model"


class Dataset(VideoDatasetOptions, _DatasetFields):
    """Training images and captions."""
    TAB: ClassVar[str] = "Dataset"
