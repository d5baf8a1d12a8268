"""grpo_iif.py and grpo_variants.py against a git commit's (the single grpo_iif.py before the split, or the pair
after it): the same flags on the tests' tiny task must give the same metrics.csv, every column but the t_* timings.

    python results/grpo_rerun_check.py                 # against f3c7146, the file before the split
    python results/grpo_rerun_check.py --commit 99daf99   # a commit after the split: each script against its own
    python results/grpo_rerun_check.py --runs OTHER/results/runs results/runs   # two sets of runs

Each configuration runs in a fresh process, once with the earlier file and once with today's pair,
for 4 generation batches of 16 completions (4 prompts x 4) in 2 micro-batches. grpo_iif.py's runs
have no test metric (the earlier file's run gets --eval-every 0); grpo_variants.py's measure the test
toxicity (or accuracy) after each batch. A column the earlier file wrote and today's does not must be
empty there.
With --runs, it compares instead the runs of results/grpo_filters.sh in two folders (a checkout of
the earlier file running the same script, and today's), run by run.
"""
import argparse
import csv
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CONFIGS = {  # name: (today's script, flags)
    "influence": ("grpo_iif.py", ["--filter-method", "influence"]),
    "influence-test": ("grpo_variants.py", ["--filter-method", "influence"]),
    "random": ("grpo_iif.py", ["--filter-method", "random"]),
    "none-beta0": ("grpo_iif.py", ["--filter-method", "none", "--beta", "0"]),
    "max-variance": ("grpo_variants.py", ["--filter-method", "max-variance", "--keep-fraction", "0.5"]),
    "validation-target": ("grpo_variants.py", ["--filter-method", "influence", "--target-data", "validation",
                                               "--validation-size", "2"]),
    "exact-answer": ("grpo_variants.py", ["--reward-fn", "exact-answer", "--filter-method", "influence",
                                          "--gen-tokens", "4"]),
}


def build_task(out):
    """The tests' tiny task (tests/conftest.py), and 2-digit addition rows for exact-answer"""
    import torch
    from benchmarks.addition_toy_task import pairs, write_rows
    from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_classifier, tiny_lm, write_data
    torch.manual_seed(0)
    tok = byte_tokenizer()
    write_data(out, random.Random(0), n_prompts=60, n_eval=40)
    for name, model in [("policy", tiny_lm(tok, "gpt2", width=32, heads=2)),
                        ("reward", tiny_classifier(tok, ["nothate", "hate"], width=32, heads=2)),
                        ("eval_reward", tiny_classifier(tok, ["not offensive", "offensive"], width=32, heads=2))]:
        model.save_pretrained(os.path.join(out, name))
        tok.save_pretrained(os.path.join(out, name))
    train, test = pairs(0, 20)
    write_rows(os.path.join(out, "add_train.jsonl"), train[:60])
    write_rows(os.path.join(out, "add_test.jsonl"), test)


def flags(task, runs, name, extra, test):
    """test: the test metric's flags, or (the earlier file with none of today's test) --eval-every 0"""
    exact = "exact-answer" in extra
    return ["--model-name", f"{task}/policy", "--reward-model", f"{task}/reward",
            "--dataset", f"{task}/{'add_train.jsonl' if exact else 'prompts.jsonl'}",
            *(["--eval-dataset", f"{task}/{'add_test.jsonl' if exact else 'wiki_toxic.jsonl'}",
               "--eval-reward-model", f"{task}/eval_reward", "--eval-samples", "4"] if test else
              ["--eval-every", "0"] if test is None else []), "--num-generations", "4",
            "--batch-size", "16", "--mini-batch-size", "8", "--forward-batch-size", "6",
            "--threads", "1", "--use-cpu", "--max-steps", "8", "--learning-rate", "3e-3",
            "--runs-dir", runs, "--run-name", name, *(["--gen-tokens", "6"] if not exact else []), *extra]


def rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in csv.DictReader(f)]


def same(old, new):
    """The rows agree on every column both have but the t_* timings; old's other columns are empty
    (new's added columns are not compared)"""
    gone = set(old[0]) - set(new[0])
    both = [k for k in new[0] if k in old[0]]
    return (len(old) == len(new) and all(all(o[k] == "" for k in gone) for o in old)
            and [{k: r[k] for k in both} for r in old] == [{k: r[k] for k in both} for r in new])


def compare_folders(old_dir, new_dir):
    names = sorted(d for d in os.listdir(new_dir) if d.startswith("grpo-filters-")
                   and os.path.isfile(os.path.join(old_dir, d, "metrics.csv")))
    differ = [d for d in names if not same(rows(os.path.join(old_dir, d, "metrics.csv")),
                                            rows(os.path.join(new_dir, d, "metrics.csv")))]
    for prefix in sorted({d.split("__")[0] for d in names}):
        n = [d for d in names if d.startswith(prefix + "__")]
        print(f"{prefix}: {len(n) - len([d for d in differ if d in n])} of {len(n)} runs identical"
              + "".join(f"\n   DIFFER {d}" for d in differ if d in n))
    return len(differ)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commit", default="f3c7146", help="the earlier grpo_iif.py's commit")
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--runs", nargs=2, metavar=("EARLIER", "TODAY"), help="compare two folders of runs")
    a = ap.parse_args()
    if a.runs:
        sys.exit(compare_folders(*a.runs))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONHASHSEED="0")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        task, old = os.path.join(tmp, "task"), os.path.join(tmp, "old")
        os.makedirs(old)
        os.makedirs(task)
        build_task(task)
        for f in ("grpo_iif.py", "grpo_variants.py"):  # a commit after the split has both: each runs as today's
            for where in (f, f"research/{f}"):  # the top level before the research folder
                show = subprocess.run(["git", "show", f"{a.commit}:{where}"], cwd=ROOT, capture_output=True, text=True)
                if show.returncode == 0:
                    break
            if show.returncode == 0:
                with open(os.path.join(old, f), "w") as out:
                    out.write(show.stdout)
        split = os.path.exists(os.path.join(old, "grpo_variants.py"))
        for name in a.configs:
            script, extra = CONFIGS[name]
            out = {}
            for who, path in (("old", os.path.join(old, script if split else "grpo_iif.py")),
                              ("new", os.path.join(ROOT, "research", script))):
                test = script == "grpo_variants.py" or (False if who == "new" or split else None)
                p = subprocess.run([sys.executable, path, *flags(task, tmp, f"{name}-{who}", extra, test)],
                                   cwd=ROOT, env=env, capture_output=True, text=True)
                if p.returncode:
                    sys.exit(f"{who} {name} failed:\n{p.stderr[-3000:]}")
                out[who] = rows(os.path.join(tmp, f"{name}-{who}", "metrics.csv"))
            ok = len(out["new"]) == 4 and same(out["old"], out["new"])
            kept = " ".join(r["n_kept"] for r in out["new"])
            print(f"{name:13s} ({script} {' '.join(extra)}): {len(out['new'])} generation batches, kept {kept}: "
                  f"{'identical' if ok else 'DIFFER'}", flush=True)
            if not ok:
                for o, n in zip(out["old"], out["new"]):
                    print("   old", o, "\n   new", n)
            failed += not ok
    sys.exit(failed)


if __name__ == "__main__":
    main()
