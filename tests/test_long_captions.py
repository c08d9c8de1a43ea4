"""dataset.max_token_length 150/225: long captions are encoded in 75-token windows and
concatenated; a short caption's first window is exactly the ordinary 77-token encoding."""
import pytest
import torch
from safetensors.torch import load_file

from conftest import make_dataset
from trainer_backend.families.sd.loader import load_model
from trainer_backend.families.sd.text import encode_text, tokenize

LONG = ", ".join(f"tag{i} red square" for i in range(60))  # well over 75 tokens


@pytest.mark.parametrize("arch", ["sd1", "sdxl"])
def test_short_caption_first_window_is_the_ordinary_encoding(arch, tiny_models):
    model = load_model(str(tiny_models(arch)))
    captions = ["a red square", LONG]
    plain = tokenize(model, captions)
    chunked = tokenize(model, captions, 150)
    for p, c in zip(plain, chunked):
        assert c.shape == (2, 2, 77)
        assert torch.equal(c[0, 0], p[0])           # short caption: window 1 = the usual tokens
        assert torch.equal(c[1, 0], p[1])           # long caption: window 1 = its first 75 tokens
        assert not torch.equal(c[1, 1], c[0, 1])    # ...and window 2 holds the rest, not an empty prompt
    with torch.no_grad():
        hidden, pooled = encode_text(model, plain)
        long_hidden, long_pooled = encode_text(model, chunked)
    assert long_hidden.shape == (2, 154, hidden.shape[-1])
    assert torch.allclose(long_hidden[:, :77], hidden, atol=1e-6)
    if arch == "sdxl":
        assert torch.allclose(long_pooled, pooled, atol=1e-6)
    else:
        assert pooled is None and long_pooled is None


def test_training_with_long_captions_and_cached_outputs_agree(tmp_path, tiny_models):
    """SDXL (two encoders, pooled from the first window) trains with 225-token captions, and the
    cached text-encoder outputs give the same weights as encoding every step."""
    from test_training_math import run_training
    data = make_dataset(tmp_path / "data", n=2, size=32, captions=[LONG, "a blue square"])
    common = ["schedule.max_steps=2", "optimizer.name=sgd", "optimizer.lr=0.5", "network.dropout=0",
              "dataset.max_token_length=225"]
    plain, events = run_training(tmp_path, tiny_models("sdxl"), data, "plain", *common)
    cached, _ = run_training(tmp_path, tiny_models("sdxl"), data, "cached", *common,
                             "dataset.cache_text_encoder_outputs=true")
    assert all(e["loss"] == e["loss"] for e in events if e["event"] == "step")  # finite, not NaN
    a, b = load_file(str(plain / "plain.safetensors")), load_file(str(cached / "cached.safetensors"))
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7), k
