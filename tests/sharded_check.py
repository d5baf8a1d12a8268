"""Run by tests/test_grpo_sharded.py under accelerate launch or torch.distributed.run (2 CPU processes):
grpo_variants.main (grpo_iif.py with TRL's checkpoints) in float64, with LoRA weights set from a fixed seed and the first generation batch replaced by
the one in $CHECK_DIR/batch.pt (each process takes its half). Saves what the test compares with one process:
each process's influence scores and the function that computed them, the kept mask, and the first step's
gradient before clipping."""
import os
import sys

import torch
import tyro
from transformers import Trainer
from trl import GRPOTrainer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(sys.path[0], "research"))  # the files beyond the paper
import grpo_iif  # noqa: E402
import grpo_variants  # noqa: E402


def set_lora_(model):
    """The same trained weights on every process and in the test, whatever peft's initialisation"""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def patch(owner, name):
    """Decorator: owner.name becomes the decorated function, which gets the original as first argument"""
    def wrap(f):
        inner = getattr(owner, name)
        setattr(owner, name, lambda *a, **kw: f(inner, *a, **kw))
        return f
    return wrap


def allow_fsdp_on_cpu():
    """accelerate applies an FSDP config on accelerators (GPUs, ...) only: on CPUs it runs DDP instead, without
    a word. Apply it on CPUs as on GPUs; torch's FSDP2 runs on CPUs with gloo."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    @patch(AcceleratorState, "__init__")
    def init(inner, self, *a, fsdp_plugin=None, **kw):
        inner(self, *a, fsdp_plugin=fsdp_plugin, **kw)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            # AcceleratorState copies PartialState's distributed_type whenever it is made
            PartialState._shared_state["distributed_type"] = self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin


def main():
    allow_fsdp_on_cpu()
    out = os.environ["CHECK_DIR"]
    saved = torch.load(os.path.join(out, "batch.pt"))
    rank = int(os.environ["RANK"])

    @patch(grpo_iif, "make_trainer")
    def make_trainer(inner, *a, **kw):
        trainer = inner(*a, **kw)
        set_lora_(trainer.model)
        return trainer

    @patch(GRPOTrainer, "_generate_and_score_completions")
    def first_batch_from_file(inner, self, inputs):
        if not self.model.training or self.state.global_step > 0:
            return inner(self, inputs)
        self.rewards = saved["rewards"]
        n = len(saved["batch"]["advantages"]) // self.accelerator.num_processes
        return grpo_iif.take_rows(saved["batch"], torch.arange(rank * n, (rank + 1) * n))

    for name in ("influence", "influence_forward_mode"):
        @patch(grpo_iif, name)
        def score_and_save(inner, model, b, t, args, name=name, **kw):
            scores = inner(model, b, t, args, **kw)
            path = os.path.join(out, f"scores_{rank}.pt")
            if not os.path.exists(path):  # the first generation batch's
                torch.save({"scores": scores, "by": name}, path)
            return scores

    @patch(grpo_iif, "filter_records")
    def filter_and_save(inner, scores, *a):
        kept, n_negative = inner(scores, *a)
        if rank == 0 and not os.path.exists(os.path.join(out, "kept.pt")):
            torch.save(kept, os.path.join(out, "kept.pt"))
        return kept, n_negative

    @patch(Trainer, "_clip_grad_norm")
    def save_grads_and_clip(inner, self, model):
        if self.state.global_step == 0:
            params = self.accelerator.unwrap_model(model).named_parameters()
            grads = {n: p.grad for n, p in params if p.requires_grad}
            # FSDP2 holds each process's shard: gather them (every process takes part)
            grads = {n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in grads.items()}
            if rank == 0:
                torch.save(grads, os.path.join(out, "grads.pt"))
        return inner(self, model)

    trainer = grpo_variants.main(grpo_variants.resolve_args(tyro.cli(grpo_variants.Args)), dtype=torch.float64)
    acc = trainer.accelerator
    with open(os.path.join(out, f"done_{rank}"), "w") as f:
        f.write(f"{acc.distributed_type.value} {acc.num_processes}")
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as grpo_iif.py ends


if __name__ == "__main__":
    main()
