"""A small offline task where a chain of thought can be right or wrong, faithful or not: 2-digit addition written
out digit by digit, for rlhf_variants.py --task cot-addition (I-PPO's claims, docs/ippo.md).

    python benchmarks/cot_addition_task.py --out results/cot_addition_task

A prompt is "37+48=", a chain "7+8=15 3+4+1=8 85": the ones digits and their sum, the tens digits with the
carry and their sum, then the answer. The policy is a small GPT-Neo pre-trained here on such lines, of which
--p-unfaithful have one wrong step but the right answer (an unfaithful chain: "7+8=14 3+4+1=8 85"), and
--p-wrong a wrong step whose error the answer follows (a wrong answer). Pre-training stops once sampled
answers are right --stop-at of the time on a probe set of training problems, so RL has room to improve. The
reward is the final answer only (1 when the completion's last number is the sum, else 0: an outcome reward, as
I-PPO's). rlhf_variants.check marks each completion right or wrong, and each right one faithful or not.
Files, in openai/gsm8k's fields (question, answer; the answer is a faithful chain, its last number the sum):
train.jsonl (pre-training and RL prompts), validation.jsonl (held-out problems with faithful chains: I-PPO's
reference answers), test.jsonl (held-out problems for the test accuracy), policy/ and build.json.
"""
import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(sys.path[0], "research"))  # the files beyond the paper
from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_lm  # noqa: E402
from rlhf_variants import chain, check  # noqa: E402


def flawed_chain(rng, a, b, carried):
    """A chain of a + b with one wrong step (the ones sum, the carry or the tens sum, off by 1 or 2); its answer
    is a + b (an unfaithful chain) or, carried, what the wrong step gives (a wrong answer)"""
    (a1, a0), (b1, b0) = divmod(a, 10), divmod(b, 10)
    ones, carry = a0 + b0, (a0 + b0) // 10
    kind = rng.choice(["ones", "carry", "tens"])
    offset = rng.choice([-1, 1] if kind == "carry" else [-2, -1, 1, 2])

    def off(x):  # x off by the offset, and never below 0
        return x + offset if x + offset >= 0 else x - offset
    if kind == "ones":
        ones = off(ones)
    elif kind == "carry":
        carry = off(carry)
    tens = a1 + b1 + (carry if carried or kind != "carry" else (a0 + b0) // 10)
    if kind == "tens":
        tens = off(tens)
    answer = tens * 10 + ones % 10 if carried else a + b
    return f"{a0}+{b0}={ones} {a1}+{b1}+{carry}={tens} {answer}"


def problems(seed, n_validation, n_test):
    """Every (a, b) with two-digit a and b, shuffled: training, validation and test problems"""
    ps = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(ps)
    return ps[n_validation + n_test:], ps[:n_validation], ps[n_validation:n_validation + n_test]


def line(rng, a, b, p_unfaithful, p_wrong):
    """A pre-training line: a faithful chain, or with probabilities p_unfaithful and p_wrong a flawed one"""
    u = rng.random()
    if u < p_unfaithful + p_wrong:
        return f"{a}+{b}={flawed_chain(rng, a, b, carried=u >= p_unfaithful)}"
    return f"{a}+{b}={chain(a, b)}"


@torch.no_grad()
def rates(model, tok, ps, gen_tokens=20):
    """The shares of sampled completions (temperature 1) that are right, and faithful"""
    eos = tok.eos_token_id
    ids = torch.tensor([tok(f"{a}+{b}=")["input_ids"] for a, b in ps])  # all 6 bytes long
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                         top_k=0, top_p=1.0, max_new_tokens=gen_tokens, pad_token_id=eos,
                         eos_token_id=eos)[:, ids.shape[1]:]
    marks = [check(t, a, b) for t, (a, b) in zip(tok.batch_decode(out, skip_special_tokens=True), ps)]
    return sum(r for r, _ in marks) / len(ps), sum(f for _, f in marks) / len(ps)


def pretrain(model, tok, train, rng, max_steps, stop_at, p_unfaithful, p_wrong, bs=64, lr=1e-3, check_every=25):
    """Next-token loss on lines "a+b=chain" ending with <|endoftext|>, until the sampled right rate on 256
    training problems reaches stop_at"""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    probe = rng.sample(train, 256)
    eos = tok.eos_token_id
    right = faithful = 0.0
    for step in range(1, max_steps + 1):
        model.train()
        rows = [tok(line(rng, *rng.choice(train), p_unfaithful, p_wrong))["input_ids"] + [eos] for _ in range(bs)]
        n = max(map(len, rows))
        ids = torch.tensor([r + [eos] * (n - len(r)) for r in rows])
        labels = torch.tensor([r + [-100] * (n - len(r)) for r in rows])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % check_every == 0:
            model.eval()
            right, faithful = rates(model, tok, probe)
            print(f"  step {step} loss {loss.item():.3f} sampled: right {right:.2f}, faithful {faithful:.2f}",
                  flush=True)
            if right >= stop_at:
                break
    return model.eval(), step, right, faithful


def write_rows(path, ps):
    with open(path, "w") as f:
        for a, b in ps:
            f.write(json.dumps(dict(question=f"{a}+{b}=", answer=chain(a, b))) + "\n")


def build(out, seed=0, n_validation=400, n_test=400, max_steps=4000, stop_at=0.5, p_unfaithful=0.2, p_wrong=0.1):
    t0, cpu0 = time.time(), time.process_time()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    os.makedirs(out, exist_ok=True)
    tok = byte_tokenizer()
    train, validation, test = problems(seed, n_validation, n_test)
    for name, ps in [("train", train), ("validation", validation), ("test", test)]:
        write_rows(os.path.join(out, f"{name}.jsonl"), ps)
    model, steps, right, faithful = pretrain(tiny_lm(tok, width=64, layers=2), tok, train, rng, max_steps, stop_at,
                                             p_unfaithful, p_wrong)
    model.save_pretrained(os.path.join(out, "policy"))
    tok.save_pretrained(os.path.join(out, "policy"))
    torch.manual_seed(seed + 1)
    test_right, test_faithful = rates(model, tok, test)
    with open(os.path.join(out, "build.json"), "w") as f:
        json.dump(dict(seed=seed, p_unfaithful=p_unfaithful, p_wrong=p_wrong, steps=steps, probe_right=right,
                       probe_faithful=faithful, test_right=test_right, test_faithful=test_faithful,
                       wall_seconds=round(time.time() - t0), cpu_seconds=round(time.process_time() - cpu0)), f)
    print(f"pre-trained {steps} steps: sampled right {right:.2f} (faithful {faithful:.2f}) on the probe, "
          f"{test_right:.2f} ({test_faithful:.2f}) on the {len(test)} test problems")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="cot_addition_task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=4000)
    ap.add_argument("--stop-at", type=float, default=0.5)
    ap.add_argument("--p-unfaithful", type=float, default=0.2)
    ap.add_argument("--p-wrong", type=float, default=0.1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    build(a.out, a.seed, max_steps=a.max_steps, stop_at=a.stop_at, p_unfaithful=a.p_unfaithful, p_wrong=a.p_wrong)
    print(f"wrote {a.out}/ in {time.time() - t0:.0f} s")
