"""kohya_ss JSON import: supported keys are mapped, the rest are listed, secrets are dropped,
and the result saves as a preset that loads back."""
from __future__ import annotations

import json

import pytest

from gui.kohya_import import ImportProblem, import_kohya, report_markdown
from gui.presets import PresetStore

# Key names and value styles as kohya_ss's GUI saves them (strings for numbers, "" = unset).
KOHYA_LORA = {
    "LoRA_type": "Standard", "pretrained_model_name_or_path": "/models/sd15.safetensors",
    "train_data_dir": "/data/img", "output_dir": "/data/out", "output_name": "my lora!",
    "network_dim": 32, "network_alpha": 16, "learning_rate": 0.0001, "unet_lr": 0.0002,
    "text_encoder_lr": 5e-05, "train_batch_size": 4, "epoch": 6, "max_train_epochs": "",
    "max_train_steps": "1200", "mixed_precision": "fp16", "seed": "1234", "gradient_accumulation_steps": "2",
    "lr_scheduler": "cosine", "lr_warmup": 10, "optimizer": "AdamW8bit",
    "optimizer_args": "weight_decay=0.05 betas=0.9,0.99 foo=bar", "max_resolution": "768,768",
    "caption_extension": ".caption", "flip_aug": True, "cache_latents": True, "shuffle_caption": True,
    "keep_tokens": "1", "min_snr_gamma": 5, "noise_offset": 0.05, "noise_offset_type": "Original",
    "gradient_checkpointing": True, "xformers": "xformers", "sdxl": False, "v2": False,
    "save_every_n_steps": 200, "max_data_loader_n_workers": "0", "multires_noise_iterations": 8,
    "color_aug": False, "wandb_api_key": "wb-secret-123", "huggingface_token": "", "logging_dir": "./logs",
    "scale_weight_norms": 1.5,
}


def test_supported_keys_are_mapped_to_the_studio_schema():
    result = import_kohya(json.dumps(KOHYA_LORA))
    cfg = result.config()
    assert cfg.model.path == "/models/sd15.safetensors" and cfg.model.arch == "sd1"
    assert cfg.dataset.path == "/data/img" and cfg.dataset.resolution == 768
    assert cfg.dataset.caption_extension == ".caption" and cfg.dataset.flip and cfg.dataset.shuffle_tags
    assert cfg.dataset.keep_tokens == 1 and cfg.dataset.cache_latents
    assert cfg.output.dir == "/data/out" and cfg.output.name == "my lora-"
    assert (cfg.network.type, cfg.network.rank, cfg.network.alpha) == ("lora", 32, 16.0)
    assert cfg.network.train_text_encoder and cfg.network.text_encoder_lr == 5e-05
    assert cfg.optimizer.lr == 0.0002              # kohya's unet_lr wins over learning_rate for LoRA
    assert cfg.optimizer.name == "adamw8bit" and cfg.optimizer.scheduler == "cosine"
    assert cfg.optimizer.weight_decay == 0.05 and (cfg.optimizer.beta1, cfg.optimizer.beta2) == (0.9, 0.99)
    assert cfg.optimizer.warmup_steps == 120      # 10 % of max_train_steps
    assert (cfg.schedule.batch_size, cfg.schedule.grad_accum, cfg.schedule.epochs) == (4, 2, 6)
    assert cfg.schedule.max_steps == 1200 and cfg.schedule.seed == 1234
    assert cfg.precision.mixed == "fp16" and cfg.precision.gradient_checkpointing
    assert cfg.loss.min_snr_gamma == 5 and cfg.loss.noise_offset == 0.05
    assert cfg.checkpoints.every_n_steps == 200


def test_fused_optimizer_argument_maps_only_where_a_fused_kernel_exists():
    fused = {**KOHYA_LORA, "optimizer": "AdamW", "optimizer_args": "fused=True weight_decay=0.1"}
    cfg = import_kohya(fused).config()
    assert cfg.optimizer.name == "adamw" and cfg.optimizer.fused and cfg.optimizer.weight_decay == 0.1
    eight_bit = import_kohya({**fused, "optimizer": "AdamW8bit"})
    assert not eight_bit.config().optimizer.fused and "optimizer_args fused" in dict(eight_bit.unsupported)


def test_report_lists_unsupported_keys_and_never_imports_secrets():
    result = import_kohya(KOHYA_LORA)
    unsupported = dict(result.unsupported)
    assert unsupported["multires_noise_iterations"] == 8
    assert unsupported["scale_weight_norms"] == 1.5
    assert "optimizer_args foo" in unsupported
    assert "color_aug" in result.unset               # off in the file: listed, not alarming
    assert "wandb_api_key" not in unsupported
    assert "wb-secret-123" not in json.dumps(result.data)
    report = report_markdown(result)
    assert "multires_noise_iterations" in report and "Not supported" in report
    assert "wb-secret-123" not in report and "wandb_api_key is a secret" in report
    mapped = {k for k, _, _ in result.mapped}
    assert {"network_dim", "train_batch_size", "pretrained_model_name_or_path"} <= mapped


def test_sdxl_dreambooth_config_becomes_a_full_finetune():
    result = import_kohya({"pretrained_model_name_or_path": "/m/sdxl", "sdxl": True, "train_data_dir": "/d",
                           "learning_rate": 1e-6, "train_batch_size": 1, "optimizer": "Adafactor",
                           "lr_scheduler": "adafactor", "xformers": "none"})
    cfg = result.config()
    # kohya's lr_scheduler "adafactor" is Adafactor's relative-step mode: adaptive, imported as Prodigy
    assert cfg.model.arch == "sdxl" and cfg.network.type == "full" and cfg.optimizer.name == "prodigy"
    assert cfg.precision.attention == "default" and cfg.optimizer.lr == 1.0
    assert any("full fine-tune" in n for n in result.notes)


def test_values_the_schema_rejects_are_reported_not_imported():
    result = import_kohya({"train_batch_size": 100000, "network_dim": 8, "LoRA_type": "LyCORIS/LoKr",
                           "optimizer": "SGDP"})
    cfg = result.config()
    assert cfg.schedule.batch_size == 1 and cfg.network.type == "lokr" and cfg.network.rank == 8
    rejected = dict(result.unsupported)
    assert "rejected" in str(rejected["train_batch_size"]) and "4096" in str(rejected["train_batch_size"])
    assert rejected["optimizer"] == "SGDP"


def test_not_json_is_a_clear_error():
    with pytest.raises(ImportProblem, match="not a kohya_ss JSON"):
        import_kohya("{not json")
    with pytest.raises(ImportProblem):
        import_kohya("[1, 2]")


def test_import_saves_a_preset_that_loads_back(tmp_path):
    store = PresetStore(tmp_path / "user")
    result = import_kohya(KOHYA_LORA)
    preset = store.save("from kohya", result.config())
    text = preset.path.read_text()
    assert "wb-secret" not in text
    loaded = store.load("from kohya")
    assert loaded.network.rank == 32 and loaded.dataset.path == "/data/img"


def test_locon_dreambooth_and_sample_keys_are_mapped():
    src = {"LoRA_type": "LyCORIS/LoCon", "network_dim": 16, "network_alpha": 8, "conv_dim": 4, "conv_alpha": 2,
           "prior_loss_weight": "0.5", "reg_data_dir": "/data/reg", "sample_every_n_steps": 100,
           "sample_every_n_epochs": 0, "sample_prompts": "a photo of sks dog --w 512 --h 512",
           "sample_sampler": "euler_a", "save_every_n_epochs": 2}
    result = import_kohya(src)
    cfg = result.config()
    assert (cfg.network.type, cfg.network.conv_rank, cfg.network.conv_alpha) == ("lora", 4, 2.0)
    assert cfg.dataset.prior_loss_weight == 0.5 and cfg.dataset.class_path == "/data/reg"
    assert cfg.samples.every_n_steps == 100 and cfg.samples.scheduler == "euler_a"
    assert cfg.samples.prompts.startswith("a photo of sks dog") and cfg.checkpoints.every_n_epochs == 2
    assert not result.unsupported, result.unsupported


def test_clip_skip_network_weights_masks_and_block_lr_are_mapped():
    src = {"LoRA_type": "Standard", "network_dim": 8, "network_alpha": 4, "clip_skip": "2",
           "lora_network_weights": "/loras/start.safetensors", "masked_loss": True,
           "conditioning_data_dir": "/data/masks", "down_lr_weight": "0,0,0.5,,1,1,1,1,1,1,1,1",
           "mid_lr_weight": "2", "up_lr_weight": "sine", "block_lr_zero_threshold": "0.1"}
    result = import_kohya(src)
    cfg = result.config()
    assert cfg.model.clip_skip == 2 and cfg.network.network_weights == "/loras/start.safetensors"
    assert cfg.loss.masked and cfg.dataset.mask_path == "/data/masks"
    block_lr = cfg.network.block_lr
    assert block_lr["IN01"] == 0 and block_lr["IN02"] == 0.5 and block_lr["IN03"] == 0  # empty entry = 0
    assert "IN00" not in block_lr and "IN04" not in block_lr and block_lr["M*"] == 2
    # sine: OUT00 = 0, OUT01 = sin(π/2 · 1/11), above the 0.1 threshold
    assert block_lr["OUT00"] == 0 and block_lr["OUT01"] == pytest.approx(0.142315)
    assert "OUT11" not in block_lr                 # sine ends at 1
    assert not result.unsupported, result.unsupported


def test_sdxl_block_weights_and_clip_skip():
    src = {"LoRA_type": "Standard", "sdxl": True, "network_dim": 8, "clip_skip": 2,
           "mid_lr_weight": "1,0,1", "down_lr_weight": "zeros+0.5"}
    result = import_kohya(src)
    cfg = result.config()
    assert cfg.model.clip_skip == 1 and any("clip_skip 2 not imported" in n for n in result.notes)
    assert cfg.network.block_lr == {**{f"IN{k:02d}": 0.5 for k in range(1, 9)}, "M01": 0.0}
    # without masked_loss kohya's conditioning images are ControlNet inputs: not taken as masks
    assert dict(import_kohya({"conditioning_data_dir": "/c"}).unsupported) == {"conditioning_data_dir": "/c"}
