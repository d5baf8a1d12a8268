import os
import random
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_classifier, tiny_lm, write_data  # noqa: E402


@pytest.fixture(scope="session")
def toy(tmp_path_factory):
    """The RLHF and GRPO tests' task: untrained tiny models saved with save_pretrained, loaded back by
    path as the hub models would be, and tiny jsonl data"""
    out = tmp_path_factory.mktemp("toy")
    torch.manual_seed(0)
    tok = byte_tokenizer()
    write_data(str(out), random.Random(0), n_prompts=60, n_eval=40)
    for name, model in [("policy", tiny_lm(tok, "gpt2", width=32, heads=2)),
                        ("reward", tiny_classifier(tok, ["nothate", "hate"], width=32, heads=2)),
                        ("eval_reward", tiny_classifier(tok, ["not offensive", "offensive"], width=32, heads=2))]:
        model.save_pretrained(out / name)
        tok.save_pretrained(out / name)
    return out
