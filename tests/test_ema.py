"""EMA: the update rule on a toy parameter (every N steps, decay), placement, and in a real run:
saved with checkpoints, restored on resume, and used for the final output when asked."""
import shutil

import torch
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.training.ema import EMA, ema_device


def test_update_every_n_steps_with_per_step_decay():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    ema = EMA({"p": p}, decay=0.9, every_n_steps=3, placement="cpu")
    expected = p.detach().clone()
    for step in range(1, 10):
        with torch.no_grad():
            p.add_(1.0)  # "training" moves the weight every step
        updated = ema.step(step)
        assert updated == (step % 3 == 0)
        if updated:  # decay per optimizer step: 0.9 ** 3 per update of every 3 steps
            expected = 0.9 ** 3 * expected + (1 - 0.9 ** 3) * p.detach()
        assert torch.allclose(ema.shadow["p"], expected, atol=1e-6), step
    assert ema.updates == 3
    with ema.applied():  # the EMA weights are swapped in, then the trained ones come back
        assert torch.allclose(p.detach(), expected)
    assert torch.equal(p.detach(), torch.tensor([10.0, 7.0]))


def test_placement_and_inactive_ranks():
    p = torch.nn.Parameter(torch.ones(3))
    cpu = EMA({"p": p}, 0.99, placement="cpu")
    assert cpu.shadow["p"].device == torch.device("cpu") and cpu.shadow["p"].dtype == torch.float32
    assert cpu.shadow["p"].data_ptr() != p.data_ptr()  # a copy, not the weight itself
    assert ema_device("cpu", torch.device("cuda", 1)) == torch.device("cpu")
    assert ema_device("accelerator", torch.device("cuda", 1)) == torch.device("cuda", 1)
    other_rank = EMA({"p": p}, 0.99, active=False)  # only the main process keeps an EMA
    assert other_rank.shadow == {} and other_rank.step(1) is False


def test_ema_checkpointed_resumed_and_saved_as_output(tmp_path, tiny_models):
    """Run A: 4 steps, checkpoints at 2 and 4. Run B: A's run dir cut back to the step-2
    checkpoint and resumed to 4. Both end with the same EMA, which is the output (not the raw
    adapter weights)."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    common = ["schedule.max_steps=4", "checkpoints.every_n_steps=2", "optimizer.lr=1e-2", "ema.enabled=true",
              "ema.decay=0.5", "network.dropout=0"]
    run_a, _, _ = train_run(tmp_path, tiny_models("sd1"), data, "a", *common)
    ckpt = run_a / "checkpoints"
    assert (ckpt / "step-00000002" / "ema.safetensors").is_file()

    run_b = tmp_path / "runs" / "b"
    (run_b / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt / "step-00000002", run_b / "checkpoints" / "step-00000002")
    _, events_b, _ = train_run(tmp_path, tiny_models("sd1"), data, "b", *common)
    assert [e["step"] for e in events_b if e["event"] == "resumed"] == [2]

    ema_a = load_file(str(ckpt / "step-00000004" / "ema.safetensors"))
    ema_b = load_file(str(run_b / "checkpoints" / "step-00000004" / "ema.safetensors"))
    raw = load_file(str(ckpt / "step-00000004" / "adapter_unet.safetensors"))
    for k in ema_a:
        assert torch.allclose(ema_a[k], ema_b[k], rtol=1e-5, atol=1e-7), k
    out_a, out_b = load_file(str(run_a / "a.safetensors")), load_file(str(run_b / "b.safetensors"))
    # the kohya output holds the EMA: its lora_up of the first attention block equals the EMA's lora_B
    key = next(k for k in raw if k.endswith("lora_B.weight"))
    kohya = next(k for k in out_a if k.endswith("lora_up.weight") and
                 k.startswith("lora_unet_" + key.split(".lora_B")[0].replace(".", "_")))
    assert torch.allclose(out_a[kohya], ema_a["unet." + key.replace(".lora_B.weight", ".lora_B.default.weight")])
    assert not torch.allclose(out_a[kohya], raw[key])
    assert torch.allclose(out_a[kohya], out_b[kohya], rtol=1e-5, atol=1e-7)
