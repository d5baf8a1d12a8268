"""A small offline verifiable-reward task for grpo_variants.py --reward-fn exact-answer: 2-digit addition.

    python benchmarks/addition_toy_task.py --out results/addition_toy_task
    T=results/addition_toy_task
    python research/grpo_variants.py --reward-fn exact-answer --model-name $T/policy --dataset $T/train.jsonl \
        --eval-dataset $T/test.jsonl --gen-tokens 4 ...      # the flags of results/grpo_filters.sh

A prompt is "37+48=", its answer "85"; the reward is 1 when the completion's last number is the sum
and 0 otherwise, checked exactly. The rows follow openai/gsm8k's fields (question, answer), so the
same flags serve GSM8K on a GPU. Text is byte-level, as in benchmarks/rlhf_toy_task.py.

The policy is a small GPT-Neo pre-trained here on lines of problems of train.jsonl with their sums,
"a+b=c", each followed by another with probability --p-more (as packed pre-training text is), then
<|endoftext|>. So the pre-trained policy sometimes goes on after its answer (" 12+..."), which makes
the answer wrong, as well as getting sums wrong. Pre-training stops early, once its sampled
answers (temperature 1, 4 tokens, as GRPO samples them) are exactly right --stop-at of the time on a
probe set of training pairs: GRPO then has room to improve (stopping after the answer, and the sums),
and a group of 8 samples is sometimes all right or all wrong. test.jsonl holds --n-test pairs that
neither the pre-training nor GRPO sees. Pre-training takes one to four minutes on one core.
"""
import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_lm  # noqa: E402


def pairs(seed, n_test):
    """Every (a, b) with two-digit a and b, shuffled; the first n_test are the test pairs"""
    ps = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(ps)
    return ps[n_test:], ps[:n_test]


def write_rows(path, ps):
    with open(path, "w") as f:
        for a, b in ps:
            f.write(json.dumps(dict(question=f"{a}+{b}=", answer=str(a + b))) + "\n")


@torch.no_grad()
def pass_rate(model, tok, ps):
    """The fraction of problems whose answer, sampled at temperature 1, is exactly right"""
    eos = tok.eos_token_id
    ids = torch.tensor([tok(f"{a}+{b}=")["input_ids"] for a, b in ps])  # all 6 bytes long
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                         temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=4, pad_token_id=eos,
                         eos_token_id=eos)[:, ids.shape[1]:]
    texts = tok.batch_decode(out, skip_special_tokens=True)
    return sum(t == str(a + b) for t, (a, b) in zip(texts, ps)) / len(ps)


def line(rng, train, p_more):
    """A pre-training line: "a+b=c", then with probability p_more another problem, and so on"""
    problems = [rng.choice(train)]
    while rng.random() < p_more and len(problems) < 4:
        problems.append(rng.choice(train))
    return " ".join(f"{a}+{b}={a + b}" for a, b in problems)


def pretrain(model, tok, train, rng, max_steps, stop_at, p_more, bs=64, lr=1e-3, check_every=20):
    """Next-token loss on lines of problems, each line ending with <|endoftext|> (bytes after it are
    padding, ignored), until the sampled pass rate on 256 training pairs reaches stop_at"""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    probe = rng.sample(train, 256)
    eos = tok.eos_token_id
    rate = 0.0
    for step in range(1, max_steps + 1):
        model.train()
        rows = [tok(line(rng, train, p_more))["input_ids"] + [eos] for _ in range(bs)]
        n = max(map(len, rows))
        ids = torch.tensor([r + [eos] * (n - len(r)) for r in rows])
        labels = torch.tensor([r + [-100] * (n - len(r)) for r in rows])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % check_every == 0:
            model.eval()
            rate = pass_rate(model, tok, probe)
            print(f"  step {step} loss {loss.item():.3f} sampled pass rate {rate:.2f}", flush=True)
            if rate >= stop_at:
                break
    return model.eval(), step, rate


def build(out, seed=0, n_test=400, max_steps=3000, stop_at=0.35, p_more=0.5):
    """Write policy/ (save_pretrained), train.jsonl and test.jsonl, and build.json (how it went)"""
    t0, cpu0 = time.time(), time.process_time()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    os.makedirs(out, exist_ok=True)
    tok = byte_tokenizer()
    train, test = pairs(seed, n_test)
    write_rows(os.path.join(out, "train.jsonl"), train)
    write_rows(os.path.join(out, "test.jsonl"), test)
    model, steps, rate = pretrain(tiny_lm(tok, width=64, layers=2), tok, train, rng, max_steps,
                                  stop_at, p_more)
    model.save_pretrained(os.path.join(out, "policy"))
    tok.save_pretrained(os.path.join(out, "policy"))
    torch.manual_seed(seed + 1)
    test_rate = pass_rate(model, tok, test)
    with open(os.path.join(out, "build.json"), "w") as f:
        json.dump(dict(seed=seed, steps=steps, probe_pass_rate=rate, test_pass_rate=test_rate,
                       wall_seconds=round(time.time() - t0), cpu_seconds=round(time.process_time() - cpu0)), f)
    print(f"pre-trained {steps} steps: sampled pass rate {rate:.2f} on the probe, {test_rate:.2f} "
          f"on the {len(test)} test pairs")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="addition_toy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-test", type=int, default=400)
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--stop-at", type=float, default=0.35)
    ap.add_argument("--p-more", type=float, default=0.5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    build(a.out, a.seed, a.n_test, a.max_steps, a.stop_at, a.p_more)
    print(f"wrote {a.out}/ in {time.time() - t0:.0f} s")
