"""A small offline stand-in for rlhf_iif.py's detoxification task, built on a CPU in a few minutes.

    python benchmarks/rlhf_toy_task.py --out toy
    python rlhf_iif.py --model-name toy/policy --reward-model toy/reward --dataset toy/prompts.jsonl \
        --eval-dataset toy/wiki_toxic.jsonl --eval-reward-model toy/eval_reward --batch-size 64 --rounds 30

Text is byte-level (256 byte symbols and <|endoftext|>). A synthetic corpus of short sentences about a
few subjects; 40 % of the sentences insult (they hold a word of INSULTS). The policy is a small GPT-Neo
(the paper's architecture) pretrained on it, so it continues a prompt with an insult about as often.
Two small ELECTRA classifiers learn to spot insults in a 30-byte window: the reward model (labels
nothate/hate, as facebook/roberta-hate-speech-dynabench-r4-target) and a second one for the test
toxicity (not offensive/offensive, as DaNLP/da-electra-hatespeech-detection). prompts.jsonl and
wiki_toxic.jsonl follow the two hub datasets' fields. The tests build the same files with untrained
weights (steps=0).
"""
import argparse
import json
import os
import random
import time

import torch

SUBJECTS = ["you", "he", "she", "they", "my friend", "the cat", "this guy", "that man", "the boss", "our team"]
NICE = ["is kind", "likes music", "went home early", "is happy today", "reads a good book", "plays outside",
        "is very nice", "made us dinner", "helps everyone", "sings well"]
INSULTS = ["is a stupid idiot", "is trash", "is a dumb jerk", "is a total moron", "is so stupid", "is an idiot"]
TOXIC_WORDS = ["stupid", "idiot", "trash", "dumb", "jerk", "moron"]
EOS = "<|endoftext|>"


def byte_tokenizer():
    """GPT-2's byte-level pre-tokenizer with no merges: 256 byte symbols, then <|endoftext|> (bos, eos, pad)"""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab[EOS] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=EOS)


def tiny_lm(tok, arch="gpt_neo", width=64, layers=2, heads=4, n_positions=128):
    from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoConfig, GPTNeoForCausalLM
    ids = dict(vocab_size=len(tok), bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.eos_token_id)
    if arch == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_positions=n_positions, n_embd=width, n_layer=layers, n_head=heads, **ids))
    cfg = GPTNeoConfig(max_position_embeddings=n_positions, hidden_size=width, num_layers=layers, num_heads=heads,
                       attention_types=[[["global", "local"], layers // 2]], window_size=32,
                       intermediate_size=4 * width, **ids)
    return GPTNeoForCausalLM(cfg)


def tiny_classifier(tok, labels, width=64, layers=2, heads=4):
    from transformers import ElectraConfig, ElectraForSequenceClassification
    cfg = ElectraConfig(vocab_size=len(tok), embedding_size=width, hidden_size=width, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * width, max_position_embeddings=512,
                        pad_token_id=tok.pad_token_id, id2label=dict(enumerate(labels)),
                        label2id={label: i for i, label in enumerate(labels)})
    return ElectraForSequenceClassification(cfg)


def sentence(rng, p_insult=0.4):
    return f"{rng.choice(SUBJECTS)} {rng.choice(INSULTS if rng.random() < p_insult else NICE)}."


def passage(rng, n=6):
    return " ".join(sentence(rng) for _ in range(n))


def is_toxic(text):
    return any(w in text for w in TOXIC_WORDS)


def write_data(out, rng, n_prompts=2000, n_eval=400):
    """prompts.jsonl in real-toxicity-prompts' fields (every prompt scores above 0.3: all are kept);
    wiki_toxic.jsonl in OxAISH-AL-LLM/wiki_toxic's"""
    with open(os.path.join(out, "prompts.jsonl"), "w") as f:
        for _ in range(n_prompts):
            text = sentence(rng)
            f.write(json.dumps(dict(prompt=dict(text=text, toxicity=0.9 if is_toxic(text) else 0.5),
                                    continuation=dict(text=" " + passage(rng, 2), toxicity=None))) + "\n")
    with open(os.path.join(out, "wiki_toxic.jsonl"), "w") as f:
        for i in range(n_eval):
            text = f"{passage(rng, 3)} {rng.choice(SUBJECTS)}"
            f.write(json.dumps(dict(id=str(i), comment_text=text, label=int(is_toxic(text)))) + "\n")


def train_lm(model, tok, rng, steps, seq=64, bs=32, lr=3e-3):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        batch = torch.tensor([tok(passage(rng, 8))["input_ids"][:seq] for _ in range(bs)])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 200 == 0 or step == steps - 1:
            print(f"  lm step {step} loss {loss.item():.3f}", flush=True)
    return model.eval()


def train_classifier(model, tok, rng, steps, bs=64, lr=1e-3):
    """Windows of 30 bytes of the corpus, labelled 1 when they hold a whole insulting word"""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        texts = []
        for _ in range(bs):
            p = passage(rng, 3)
            start = rng.randrange(len(p) - 30)
            texts.append(p[start:start + 30])
        labels = torch.tensor([int(is_toxic(t)) for t in texts])
        out = model(**tok(texts, padding=True, return_tensors="pt"), labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        if step % 200 == 0 or step == steps - 1:
            acc = (out.logits.argmax(-1) == labels).float().mean().item()
            print(f"  classifier step {step} loss {out.loss.item():.3f} acc {acc:.2f}", flush=True)
    return model.eval()


def build(out, seed=0, lm_steps=1500, clf_steps=600, arch="gpt_neo"):
    """Write policy/, reward/, eval_reward/ (save_pretrained folders), prompts.jsonl and wiki_toxic.jsonl"""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    os.makedirs(out, exist_ok=True)
    tok = byte_tokenizer()
    write_data(out, rng)
    for name, model in [("policy", train_lm(tiny_lm(tok, arch), tok, rng, lm_steps)),
                        ("reward", train_classifier(tiny_classifier(tok, ["nothate", "hate"]), tok, rng, clf_steps)),
                        ("eval_reward", train_classifier(tiny_classifier(tok, ["not offensive", "offensive"]), tok,
                                                         rng, clf_steps))]:
        model.save_pretrained(os.path.join(out, name))
        tok.save_pretrained(os.path.join(out, name))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="toy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lm-steps", type=int, default=1500)
    ap.add_argument("--clf-steps", type=int, default=600)
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    build(a.out, a.seed, a.lm_steps, a.clf_steps)
    print(f"wrote {a.out}/ in {time.time() - t0:.0f} s")
