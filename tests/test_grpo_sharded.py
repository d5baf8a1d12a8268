"""grpo_iif.py (through grpo_variants.py, for TRL's checkpoints) on 2 CPU processes (gloo): FSDP2 through accelerate launch and research/configs/fsdp2.yaml, DDP through
torch.distributed.run. Its influence scores, kept set and first gradient step equal one process's (float64)."""
import os
import socket
import subprocess
import sys

import pytest
import torch

import grpo_iif
import grpo_variants
from sharded_check import set_lora_
from test_grpo import ROOT, flags, parse, read_rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


LAUNCH = {"fsdp2": ["-m", "accelerate.commands.launch", "--config_file", "research/configs/fsdp2.yaml",
                    "--num_processes", "2", "--main_process_port"],
          "ddp": ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]}


@pytest.mark.parametrize("launch,extra", [("fsdp2", ["--target", "f_seq", "--beta", "0"]),  # LoRA: activations,
                                          # G from the losses' gradients (beta 0), the processes' shares added
                                          ("ddp", ["--target", "f_loss", "--no-lora"]),  # forward mode
                                          ("ddp", ["--target", "f_seq", "--beta", "0.04"])])  # LoRA: G from f's
                                          # own backward pass (beta > 0), f_seq over the processes' completions
def test_two_processes_score_filter_and_step_as_one(toy, tmp_path, launch, extra):
    extra = ["--filter-method", "influence", *extra, "--save-steps", "1", "--eval-samples", "3",
             "--mini-batch-size", "4"]
    # one process: a generation batch (4 prompts x 2), its scores, kept set and the gradient on the kept ones
    args = parse(toy, tmp_path, *extra[:-2], "--mini-batch-size", "8", name="one", script=grpo_variants)  # 2 x 4
    trainer = grpo_variants.make_trainer(args, dtype=torch.float64)
    set_lora_(trainer.model)
    trainer.model.train()
    torch.manual_seed(0)
    prompts = [{"prompt": p} for p in trainer.train_dataset["prompt"][:4] for _ in range(2)]
    b = super(grpo_iif.IIFGRPOTrainer, trainer)._generate_and_score_completions(prompts)  # TRL's, unfiltered
    torch.save({"batch": b, "rewards": trainer.rewards}, tmp_path / "batch.pt")
    model = trainer.accelerator.unwrap_model(trainer.model)
    scores = grpo_iif.influence_forward_mode(model, b, b, args)
    kept = grpo_iif.filter_records(scores, "influence", None, None)[0]
    assert 0 < kept.sum() < 8
    only_kept = grpo_iif.take_rows(b, kept.nonzero()[:, 0])
    only_kept["num_items_in_batch"] = only_kept["completion_mask"].sum()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, read by TRL's loss
    loss = trainer._compute_loss(model, only_kept)  # TRL's own, with its float32 log-probs
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))

    # two processes, two generation batches (the first one is b), test toxicity after each
    cmd = [sys.executable, *LAUNCH[launch], free_port(), "tests/sharded_check.py",
           *flags(toy, "--runs-dir", str(tmp_path / "runs"), "--run-name", "two", *extra, test=True)]
    env = dict(os.environ, CHECK_DIR=str(tmp_path), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert [open(tmp_path / f"done_{r}").read() for r in (0, 1)] == [
        ("FSDP 2" if launch == "fsdp2" else "MULTI_CPU 2")] * 2
    two = [torch.load(tmp_path / f"scores_{r}.pt") for r in (0, 1)]
    assert {s["by"] for s in two} == {"influence_forward_mode" if "--no-lora" in extra else "influence"}
    two_scores = torch.cat([s["scores"] for s in two])
    print(f"{launch}: max |2 processes - 1| = {(two_scores - scores).abs().max():.1e} "
          f"(scores up to {scores.abs().max():.1e})")
    assert (two_scores - scores).abs().max() < 1e-10 and scores.abs().max() > 1e-3
    assert torch.equal(torch.load(tmp_path / "kept.pt"), kept)
    two_grads = torch.load(tmp_path / "grads.pt")
    assert two_grads.keys() == grads.keys()
    err = max(((two_grads[n] - g).abs().max() / g.abs().max()).item() for n, g in grads.items())
    print(f"{launch}: gradients' largest difference, relative to the largest entry: {err:.1e}")
    # TRL's fused LM head computes in float32: without LoRA, the tied embeddings' gradient comes through it
    assert err < (1e-6 if "--no-lora" in extra else 1e-12)
    rows = read_rows(tmp_path / "runs" / "two")
    assert [r["round"] for r in rows] == ["0", "1"] and rows[0]["n_kept"] == str(int(kept.sum()))
    assert all(r["eval_toxicity"] != "" for r in rows)  # measured by both processes
    run = tmp_path / "runs" / "two"  # TRL's checkpoints and the final policy, saved from the shards under FSDP2
    assert (run / "checkpoint-2" / "iif_state.pt").exists()
    assert (run / "policy" / ("config.json" if "--no-lora" in extra else "adapter_config.json")).exists()

