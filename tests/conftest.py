import os
import random
import signal
import subprocess
import sys

import pytest
import torch

# offline whatever the shell exported: a hub call retries for about 50 s before it fails
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(sys.path[0], "research"))  # the files beyond the paper

from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_classifier, tiny_lm, write_data  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--gpu-check", action="store_true", help="also run benchmarks/gpu_check.sh's two calls end "
                     "to end on the CPU at a tiny shape (about 2 minutes on 2 cores): before a GPU call")


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


KILLER = """
import os, runpy, signal, sys
sys.argv = {argv!r}
sys.path.insert(0, os.path.dirname({script!r}))
import {module} as m
real, calls = m.{name}, []
def killed_at_call_n(*a, **kw):
    calls.append(1)
    if len(calls) == {n}:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **kw)
m.{name} = killed_at_call_n
runpy.run_path({script!r}, run_name="__main__")
"""


def run_killed(argv, module, name, n, env):
    """The command argv (python SCRIPT flags...) killed with SIGKILL as it calls module.name for the n-th time: a
    kill at a known point of the run, whatever the machine's load"""
    script = argv[1]
    code = KILLER.format(argv=argv[1:], script=script, module=module, name=name, n=n)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
