"""kohya_ss presets as kohya_ss's GUI saves them (shapes written for these tests, with the keys
its LoRA, DreamBooth, Finetune, SD3 and Flux tabs save): what changes how a run trains must
be imported (buckets, SDXL, optimizer arguments, adaptive optimizers), and families the studio
cannot train are refused by name instead of turning into SD1 configs."""
from __future__ import annotations

import json

import pytest

from gui.kohya_import import ImportProblem, import_kohya

# Keys every LoRA-tab file carries (values as the GUI writes them: strings for numbers, "" unset).
LORA_COMMON = {
    "LoRA_type": "Standard", "adaptive_noise_scale": 0, "additional_parameters": "", "block_alphas": "",
    "block_dims": "", "block_lr_zero_threshold": "", "bucket_no_upscale": True, "bucket_reso_steps": 64,
    "cache_latents": True, "cache_latents_to_disk": False, "caption_dropout_every_n_epochs": 0.0,
    "caption_dropout_rate": 0, "caption_extension": ".txt", "clip_skip": "1", "color_aug": False,
    "conv_alpha": 1, "conv_block_alphas": "", "conv_block_dims": "", "conv_dim": 1, "decompose_both": False,
    "dim_from_weights": False, "down_lr_weight": "", "enable_bucket": True, "epoch": 1, "factor": -1,
    "flip_aug": False, "full_bf16": False, "full_fp16": False, "gradient_accumulation_steps": 1,
    "gradient_checkpointing": False, "keep_tokens": "0", "learning_rate": 0.0001, "lora_network_weights": "",
    "lr_scheduler": "constant", "lr_scheduler_num_cycles": "", "lr_scheduler_power": "", "lr_warmup": 0,
    "max_bucket_reso": 2048, "max_data_loader_n_workers": "0", "max_resolution": "512,512", "max_timestep": 1000,
    "max_token_length": "75", "max_train_epochs": "", "max_train_steps": "", "mem_eff_attn": False,
    "mid_lr_weight": "", "min_bucket_reso": 256, "min_snr_gamma": 0, "min_timestep": 0,
    "mixed_precision": "fp16", "module_dropout": 0, "multires_noise_discount": 0, "multires_noise_iterations": 0,
    "network_alpha": 1, "network_dim": 8, "network_dropout": 0, "noise_offset": 0, "noise_offset_type": "Original",
    "num_cpu_threads_per_process": 2, "num_machines": 1, "num_processes": 1, "optimizer": "AdamW8bit",
    "optimizer_args": "", "persistent_data_loader_workers": False, "prior_loss_weight": 1.0, "random_crop": False,
    "rank_dropout": 0, "save_every_n_epochs": 1, "save_every_n_steps": 0, "save_last_n_steps": 0,
    "save_last_n_steps_state": 0, "save_precision": "fp16", "scale_v_pred_loss_like_noise_pred": False,
    "scale_weight_norms": 0, "sdxl": False, "sdxl_cache_text_encoder_outputs": False, "sdxl_no_half_vae": True,
    "seed": "", "shuffle_caption": False, "stop_text_encoder_training": 0, "text_encoder_lr": 0.0001,
    "train_batch_size": 1, "train_on_input": True, "training_comment": "", "unet_lr": 0.0001, "unit": 1,
    "up_lr_weight": "", "use_cp": False, "use_wandb": False, "v2": False, "v_parameterization": False,
    "v_pred_like_loss": 0, "vae_batch_size": 0, "weighted_captions": False, "xformers": "xformers",
}

SDXL_LORA_PRODIGY = {**LORA_COMMON, "sdxl": True, "max_resolution": "1024,1024", "network_dim": 32,
                     "network_alpha": 32, "optimizer": "Prodigy", "learning_rate": 1, "unet_lr": 1,
                     "text_encoder_lr": 1, "lr_scheduler": "cosine", "network_train_unet_only": False,
                     "optimizer_args": '"decouple=True" "weight_decay=0.1" "betas=0.9,0.99" '
                                       '"use_bias_correction=False"',
                     "cache_latents_to_disk": True, "sdxl_cache_text_encoder_outputs": True,
                     "max_token_length": "150", "full_bf16": True, "mixed_precision": "bf16",
                     "min_bucket_reso": 512, "max_bucket_reso": 2048, "bucket_reso_steps": 32,
                     "save_precision": "bf16", "num_machines": 1}

SD15_LORA_DADAPT = {**LORA_COMMON, "optimizer": "DAdaptAdam", "learning_rate": 1.0, "unet_lr": 1.0,
                    "text_encoder_lr": 0.5, "lr_scheduler": "cosine_with_restarts",
                    "optimizer_args": '"decouple=True" "weight_decay=0.01" "betas=(0.9, 0.999)"',
                    "max_resolution": "768,768"}

SDXL_LOHA_ADAFACTOR = {**LORA_COMMON, "LoRA_type": "LyCORIS/LoHa", "sdxl": True, "optimizer": "Adafactor",
                       "optimizer_args": "scale_parameter=False relative_step=False warmup_init=False",
                       "lr_scheduler": "constant_with_warmup", "learning_rate": 0.0003, "unet_lr": 0.0003,
                       "lr_warmup_steps": 100, "save_precision": "float"}

# kohya's Finetune tab: no network keys, `sdxl_checkbox` instead of `sdxl`
FINETUNE_COMMON = {
    "additional_parameters": "", "batch_size": "1", "block_lr": "", "bucket_no_upscale": False,
    "bucket_reso_steps": 64, "cache_latents": True, "cache_latents_to_disk": True, "caption_dropout_every_n_epochs": 0,
    "caption_dropout_rate": 0, "caption_extension": ".txt", "caption_metadata_filename": "meta_cap.json",
    "clip_skip": 1, "color_aug": False, "create_buckets": True, "create_caption": True, "dataset_repeats": "10",
    "epoch": 1, "flip_aug": False, "full_bf16": False, "full_fp16": False, "full_path": True,
    "gradient_accumulation_steps": 1, "gradient_checkpointing": True, "image_folder": "", "keep_tokens": 0,
    "latent_metadata_filename": "meta_lat.json", "learning_rate": 1e-06, "lr_scheduler": "constant",
    "lr_warmup": 0, "max_bucket_reso": "1024", "max_data_loader_n_workers": "0", "max_resolution": "1024,1024",
    "max_timestep": 1000, "max_token_length": "75", "max_train_epochs": "", "max_train_steps": "",
    "mem_eff_attn": False, "min_bucket_reso": "256", "min_snr_gamma": 0, "min_timestep": 0,
    "mixed_precision": "bf16", "noise_offset": 0, "noise_offset_type": "Original", "num_cpu_threads_per_process": 2,
    "num_machines": 1, "num_processes": 1, "optimizer": "AdamW", "optimizer_args": "",
    "persistent_data_loader_workers": False, "random_crop": False, "save_every_n_epochs": 1,
    "save_every_n_steps": 0, "save_precision": "fp16", "sdxl_cache_text_encoder_outputs": True,
    "sdxl_checkbox": True, "sdxl_no_half_vae": True, "seed": "1234", "shuffle_caption": False,
    "train_batch_size": 1, "train_text_encoder": False, "use_latent_files": "Yes", "v2": False,
    "v_parameterization": False, "xformers": "xformers",
}

SDXL_FINETUNE_ADAFACTOR = {**FINETUNE_COMMON, "optimizer": "Adafactor", "lr_scheduler": "adafactor",
                           "learning_rate": 1e-06,
                           "optimizer_args": "scale_parameter=True relative_step=True warmup_init=True"}
SDXL_FINETUNE_ADAMW = {**FINETUNE_COMMON, "optimizer": "AdamW8bit", "learning_rate": 4e-06,
                       "optimizer_args": '"weight_decay=0.1" "betas=0.9,0.99"', "full_bf16": True}

FLUX_LORA = {**LORA_COMMON, "flux1_checkbox": True, "sdxl": False, "t5xxl": "/m/t5xxl_fp16.safetensors",
             "clip_l": "/m/clip_l.safetensors", "ae": "/m/ae.safetensors", "discrete_flow_shift": 3.0,
             "guidance_scale": 1.0, "model_prediction_type": "raw", "timestep_sampling": "sigmoid"}
SD3_LORA = {**LORA_COMMON, "sd3_checkbox": True, "clip_g": "/m/clip_g.safetensors",
            "t5xxl": "/m/t5xxl.safetensors", "weighting_scheme": "logit_normal"}

SHAPES = {"sdxl-lora-prodigy": SDXL_LORA_PRODIGY, "sd15-lora-dadapt": SD15_LORA_DADAPT,
          "sdxl-loha-adafactor": SDXL_LOHA_ADAFACTOR, "sdxl-finetune-adafactor": SDXL_FINETUNE_ADAFACTOR,
          "sdxl-finetune-adamw": SDXL_FINETUNE_ADAMW, "sd15-lora": LORA_COMMON, "flux-lora": FLUX_LORA,
          "sd3-lora": SD3_LORA}

# Set in these shapes and truly not expressible in the schema (yet). Anything else reported
# unsupported is a key we can express and fail to map.
NOT_EXPRESSIBLE = {"num_cpu_threads_per_process", "sdxl_no_half_vae",
                   "train_on_input", "unit", "optimizer_args decouple", "optimizer_args use_bias_correction",
                   "caption_metadata_filename", "latent_metadata_filename", "create_buckets", "create_caption",
                   "dataset_repeats", "full_path", "use_latent_files", "batch_size", "factor", "conv_alpha",
                   "conv_dim"}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_key_we_can_express_is_imported(name):
    result = import_kohya(json.dumps(SHAPES[name]))
    result.config()   # the imported preset validates
    wrongly = sorted(k for k, _ in result.unsupported if k not in NOT_EXPRESSIBLE)
    assert not wrongly, f"{name}: reported unsupported although the schema has them: {wrongly}"


def test_buckets_and_memory_keys_reach_the_schema():
    cfg = import_kohya(SDXL_LORA_PRODIGY).config()
    assert cfg.dataset.bucketing is True                  # item 9: SDXL presets train on buckets
    assert (cfg.dataset.bucket_min_side, cfg.dataset.bucket_max_side, cfg.dataset.bucket_step) == (512, 2048, 32)
    assert cfg.dataset.bucket_no_upscale and cfg.dataset.cache_latents_to_disk
    assert cfg.dataset.cache_text_encoder_outputs and cfg.dataset.max_token_length == 150
    assert cfg.precision.full_bf16 and cfg.network.save_precision == "bf16" and cfg.hardware.num_machines == 1
    assert import_kohya(SDXL_LOHA_ADAFACTOR).config().network.save_precision == "fp32"   # kohya's "float"
    assert import_kohya({**LORA_COMMON, "enable_bucket": False}).config().dataset.bucketing is False


def test_finetune_tab_sdxl_checkbox_imports_as_sdxl():
    for shape in (SDXL_FINETUNE_ADAMW, SDXL_FINETUNE_ADAFACTOR):
        result = import_kohya(shape)
        cfg = result.config()
        assert cfg.model.arch == "sdxl" and cfg.network.type == "full"
        assert ("sdxl_checkbox", "model.arch", "sdxl") in result.mapped
    assert import_kohya({**FINETUNE_COMMON, "sdxl_checkbox": False}).config().model.arch == "sd1"


@pytest.mark.parametrize("shape,key,arch", [(FLUX_LORA, "flux1_checkbox", "flux"), (SD3_LORA, "sd3_checkbox", "sd3")])
def test_sd3_and_flux_presets_import_as_their_family(shape, key, arch):
    result = import_kohya(json.dumps(shape))
    cfg = result.config()
    assert cfg.model.arch == arch and (key, "model.arch", arch) in result.mapped
    if arch == "flux":  # kohya's flux options: shift 3 with sigmoid sampling, guidance 1
        assert (cfg.loss.timestep_sampling, cfg.loss.flow_shift, cfg.model.guidance) == ("sigmoid", 3.0, 1.0)
    else:
        assert cfg.loss.timestep_sampling == "logit_normal"
    # the ComfyUI-style component files reach the options that load them beside a single-file model.path
    files = {"clip_l": cfg.model.clip_l, "clip_g": cfg.model.clip_g, "t5xxl": cfg.model.t5, "ae": cfg.model.vae}
    assert {k: v for k, v in files.items() if v} == {k: shape[k] for k in files if k in shape}
    assert import_kohya({**shape, key: False}).config().model.arch == "sd1"   # the checkbox off: an SD1 file


def test_quoted_optimizer_args_are_parsed():
    cfg = import_kohya(SDXL_FINETUNE_ADAMW).config()
    assert cfg.optimizer.weight_decay == 0.1 and (cfg.optimizer.beta1, cfg.optimizer.beta2) == (0.9, 0.99)
    cfg = import_kohya(SD15_LORA_DADAPT).config()        # betas=(0.9, 0.999): parentheses and a space
    assert cfg.optimizer.weight_decay == 0.01 and (cfg.optimizer.beta1, cfg.optimizer.beta2) == (0.9, 0.999)


def test_adaptive_optimizers_stay_adaptive():
    dadapt = import_kohya(SD15_LORA_DADAPT)
    cfg = dadapt.config()
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.scheduler) == ("prodigy", 1.0, "cosine_with_restarts")
    assert any("DAdaptAdam" in n and "Prodigy" in n for n in dadapt.notes)
    relative = import_kohya(SDXL_FINETUNE_ADAFACTOR)
    cfg = relative.config()
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.scheduler) == ("prodigy", 1.0, "constant")
    assert any("relative-step Adafactor" in n for n in relative.notes)
    assert not any(k.startswith("optimizer_args relative_step") for k, _ in relative.unsupported)
    fixed = import_kohya(SDXL_LOHA_ADAFACTOR).config()   # relative_step=False: a fixed-LR Adafactor, as ours
    assert (fixed.optimizer.name, fixed.optimizer.lr, fixed.optimizer.scheduler) == \
        ("adafactor", 0.0003, "constant_with_warmup")
