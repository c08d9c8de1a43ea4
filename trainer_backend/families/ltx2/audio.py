"""LTX-2's audio stream: waveform -> log-mel spectrogram -> audio VAE latents -> the transformer's audio tokens.

The spectrogram is LTX-2's own (Lightricks' ltx-core AudioProcessor, read for its parameters; diffusers has
no waveform->mel for LTX-2): the audio VAE's sample rate (16 kHz), a 1024-point STFT with a 1024-sample Hann
window, the VAE's hop (160), centred with reflect padding, magnitudes (power 1), the VAE's mel bins (64) on the
Slaney mel scale with Slaney area normalisation from 0 Hz to Nyquist, then log(max(x, 1e-5)), laid out as
(batch, channels, time, mel bins). torchaudio is not a dependency: torch.stft and the filterbank below
implement the same arithmetic.

The VAE's posterior mean, packed and normalised as LTX2Pipeline packs and normalises audio latents
(_pack_audio_latents: [B, C, L, M] -> [B, L, C*M]; then (x - latents_mean) / latents_std per feature).
"""
from __future__ import annotations

import math

import torch

N_FFT = 1024          # LTX-2's audio processor (win_length = n_fft); not in diffusers' audio VAE config
LOG_FLOOR = 1e-5

_F_SP = 200.0 / 3     # Slaney: linear below 1 kHz (200/3 Hz per mel), logarithmic above
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = math.log(6.4) / 27.0


def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney's mel scale."""
    hz = torch.as_tensor(hz, dtype=torch.float64)
    return torch.where(hz < _MIN_LOG_HZ, hz / _F_SP,
                       _MIN_LOG_MEL + torch.log(hz.clamp(min=_MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOG_STEP)


def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    mel = torch.as_tensor(mel, dtype=torch.float64)
    return torch.where(mel < _MIN_LOG_MEL, mel * _F_SP,
                       _MIN_LOG_HZ * torch.exp(_LOG_STEP * (mel.clamp(min=_MIN_LOG_MEL) - _MIN_LOG_MEL)))


def mel_filters(sample_rate: int, n_fft: int, n_mels: int, f_min: float = 0.0, f_max: float | None = None):
    """(n_fft // 2 + 1, n_mels) triangular filters, evenly spaced on the Slaney mel scale, each divided by
    half its width in Hz (Slaney normalisation: equal area)."""
    f_max = sample_rate / 2 if f_max is None else f_max
    freqs = torch.linspace(0, sample_rate // 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = mel_to_hz(torch.linspace(float(hz_to_mel(f_min)), float(hz_to_mel(f_max)), n_mels + 2,
                                     dtype=torch.float64))
    widths = edges[1:] - edges[:-1]
    to_edges = edges.unsqueeze(0) - freqs.unsqueeze(1)               # (freqs, n_mels + 2)
    rising = -to_edges[:, :-2] / widths[:-1]
    falling = to_edges[:, 2:] / widths[1:]
    filters = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return (filters * (2.0 / (edges[2:] - edges[:-2])).unsqueeze(0)).float()


def log_mel(waveform: torch.Tensor, sample_rate: int, hop: int, n_mels: int, n_fft: int = N_FFT) -> torch.Tensor:
    """(B, channels, samples) float waveform -> (B, channels, frames, n_mels) log-mel, frames = samples // hop + 1."""
    b, c, n = waveform.shape
    flat = waveform.reshape(b * c, n).float()
    if n <= n_fft // 2:  # reflect padding needs more samples than half a window: pad a very short clip with silence
        flat = torch.nn.functional.pad(flat, (0, n_fft // 2 + 1 - n))
    window = torch.hann_window(n_fft, device=flat.device)
    spec = torch.stft(flat, n_fft, hop_length=hop, win_length=n_fft, window=window, center=True,
                      pad_mode="reflect", normalized=False, onesided=True, return_complex=True).abs()
    mel = torch.matmul(spec.transpose(1, 2), mel_filters(sample_rate, n_fft, n_mels).to(spec.device))
    frames = n // hop + 1
    return torch.log(mel.clamp(min=LOG_FLOOR))[:, :frames].reshape(b, c, -1, n_mels)


def audio_format(audio_vae) -> tuple[int, int]:
    """(sample rate, channels) the audio VAE takes."""
    return int(audio_vae.config.sample_rate), int(audio_vae.config.in_channels)


def token_width(audio_vae) -> int:
    """Features per packed audio token the encoder really gives: latent channels x the mel bins after its
    downsampling stages (each halves them); LTX2Pipeline assumes 4x (mel_compression_ratio)."""
    config = audio_vae.config
    return config.latent_channels * (config.mel_bins // 2 ** (len(config.ch_mult) - 1))


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, L, M] -> [B, L, C*M] (LTX2Pipeline._pack_audio_latents without patches)."""
    return latents.transpose(1, 2).flatten(2, 3)


def normalize(tokens: torch.Tensor, audio_vae) -> torch.Tensor:
    mean = audio_vae.latents_mean.to(tokens.device, tokens.dtype)
    std = audio_vae.latents_std.to(tokens.device, tokens.dtype)
    return (tokens - mean) / std


def encode(audio_vae, waveform: torch.Tensor) -> torch.Tensor:
    """(B, channels, samples) at the VAE's rate -> (B, L, C*M) normalised audio tokens (the posterior's mean)."""
    config = audio_vae.config
    mel = log_mel(waveform.to(next(audio_vae.parameters()).device), config.sample_rate, config.mel_hop_length,
                  config.mel_bins, getattr(config, "n_fft", N_FFT))
    latents = audio_vae.encode(mel.to(audio_vae.dtype)).latent_dist.mode()
    return normalize(pack(latents.float()), audio_vae)
