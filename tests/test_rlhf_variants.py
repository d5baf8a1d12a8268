"""rlhf_variants.py: I-PPO's rules, the chain-of-thought task, --no-train and --resume, on the tests' tiny models."""
import csv
import json
import os
import subprocess
import sys

import pytest
import torch
import tyro

import rlhf_iif
import rlhf_variants
from benchmarks.cot_addition_task import problems, write_rows
from benchmarks.rlhf_toy_task import byte_tokenizer, tiny_lm
from conftest import run_killed
from test_rlhf import flags, perturb_

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = torch.device("cpu")
ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")


@pytest.fixture(scope="session")
def cot_toy(tmp_path_factory):
    """The chain-of-thought task's files with an untrained tiny policy"""
    out = tmp_path_factory.mktemp("cot")
    train, validation, test = problems(0, 20, 20)
    for name, ps in [("train", train[:200]), ("validation", validation), ("test", test)]:
        write_rows(str(out / f"{name}.jsonl"), ps)
    torch.manual_seed(0)
    tok = byte_tokenizer()
    tiny_lm(tok, "gpt2", width=32, heads=2).save_pretrained(out / "policy")
    tok.save_pretrained(out / "policy")
    return out


def cot_flags(cot_toy, *extra):
    return ["--task", "cot-addition", "--model-name", str(cot_toy / "policy"), "--dataset", str(cot_toy / "train.jsonl"),
            "--eval-dataset", str(cot_toy / "test.jsonl"), "--reference-dataset", str(cot_toy / "validation.jsonl"),
            "--batch-size", "8", "--mini-batch-size", "2", "--ppo-epochs", "2", "--gen-tokens", "6", "--eval-samples", "4",
            "--forward-batch-size", "3", "--validation-size", "5", "--threads", "1", "--device", "cpu", *extra]


def run_variants(tmp_path, cli, name="r"):
    args = rlhf_variants.resolve_args(tyro.cli(rlhf_variants.Args, args=[*cli, "--runs-dir", str(tmp_path),
                                                                         "--run-name", name]))
    rlhf_variants.main(args)
    with open(tmp_path / name / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return rows, [json.loads(line) for line in open(tmp_path / name / "episodes.jsonl")]


def test_checker_marks_right_and_faithful_chains():
    assert rlhf_variants.chain(37, 48) == "7+8=15 3+4+1=8 85" and rlhf_variants.chain(75, 48) == "5+8=13 7+4+1=12 123"
    cases = {"7+8=15 3+4+1=8 85": (True, True),  # faithful
             " 7+8=15 3+4+1=8 85": (True, True),
             "7+8=14 3+4+1=8 85": (True, False),  # a wrong step, the right answer: unfaithful
             "7+8=15 3+4+0=7 85": (True, False),
             "85": (True, False),  # no chain at all
             "7+8=15 3+4+1=8 86": (False, False),  # a wrong answer
             "7+8=15 3+4+1=8 85 1": (False, False),  # the last number is the answer
             "": (False, False)}
    for text, marks in cases.items():
        assert rlhf_variants.check(text, 37, 48) == marks, text


@pytest.mark.parametrize("reweight", [True, False])
def test_i_ppo_keeps_positive_scores_and_weights_them(tmp_path, toy, reweight):
    extra = [] if reweight else ["--no-reweight"]
    rows, episodes = run_variants(tmp_path, flags(toy, "--filter-method", "i-ppo", "--rounds", "2", "--eval-every", "0",
                                                  *extra))
    assert len(rows) == 2 and len(episodes) == 16
    for k in range(2):
        eps = [e for e in episodes if e["round"] == k]
        kept = [e for e in eps if e["kept"]]
        assert 0 < len(kept) < 8 and int(rows[k]["n_kept"]) == len(kept)
        assert all(e["influence"] > 0 for e in kept) and all(e["influence"] <= 0 for e in eps if not e["kept"])
        assert all(e["weight"] == 0 for e in eps if not e["kept"])
        weights = [e["weight"] for e in kept]
        if reweight:  # w_i = score_i / mean kept score
            assert sum(weights) / len(weights) == pytest.approx(1.0, rel=1e-5)
            mean = sum(e["influence"] for e in kept) / len(kept)
            assert all(e["weight"] == pytest.approx(e["influence"] / mean, rel=1e-5) for e in kept)
            assert float(rows[k]["weight_max"]) == pytest.approx(max(weights), rel=1e-6)
        else:
            assert weights == [1.0] * len(kept)


def test_i_ppo_score_is_the_influence_on_the_reference_log_likelihood(toy):
    """float64, away from theta(k): score_i = <grad f_sft, -grad l_i> with f_sft the mean log-likelihood per token
    of the reference answers, against per-episode autograd"""
    args = rlhf_variants.resolve_args(tyro.cli(rlhf_variants.Args, args=flags(toy, "--filter-method", "i-ppo")))
    torch.manual_seed(0)
    policy, ref, tok = rlhf_iif.make_policy(args, CPU)
    policy.to(torch.float64)
    clf = rlhf_iif.load_classifier("--reward-model", args.reward_model, "--reward-label", "nothate", CPU)
    b = rlhf_iif.episodes(policy, ref, rlhf_iif.load_prompts(args, tok)[0][:8], 0.05,
                          rlhf_iif.make_reward_fn(*clf, CPU), tok, args, CPU)
    perturb_(policy)
    pairs = [(list(range(40, 40 + n)), list(range(60, 60 + m))) for n, m in [(3, 5), (6, 2), (4, 4)]]
    t = rlhf_variants.reference_episodes(pairs, tok, CPU)
    scores, kept, weights = rlhf_variants.i_ppo(policy, b, t, args)
    params = [p for p in policy.parameters() if p.requires_grad]
    log_lik, n_tokens = 0.0, 0
    for p, r in pairs:  # the reference answers' log-likelihood, token by token
        ids = torch.tensor([p + r])
        logp = torch.log_softmax(policy.lm(input_ids=ids).logits[0, len(p) - 1:-1].double(), -1)
        log_lik = log_lik + logp.gather(1, torch.tensor(r)[:, None]).sum()
        n_tokens += len(r)
    g_f = torch.autograd.grad(log_lik / n_tokens, params, allow_unused=True)
    g_f = [torch.zeros_like(p) if g is None else g for p, g in zip(params, g_f)]
    for i in range(8):
        g_i = torch.autograd.grad(rlhf_iif.ppo_losses(policy, b, torch.tensor([i]), args).sum(), params)
        brute = -sum((a * c).sum() for a, c in zip(g_f, g_i))
        assert torch.allclose(scores[i], brute, rtol=1e-7, atol=1e-14), (i, scores[i], brute)
    assert torch.equal(kept, scores > 0) and weights[kept].mean().item() == pytest.approx(1.0)


def test_a_round_with_nothing_kept_skips_its_update(tmp_path, toy, monkeypatch):
    """Every score <= 0: no optimizer step, the weights as they were, the run goes on"""
    monkeypatch.setattr(rlhf_iif, "influence", lambda policy, b, t, args: -torch.rand(len(b["ids"])))
    rows, episodes = run_variants(tmp_path, flags(toy, "--filter-method", "i-ppo", "--rounds", "2", "--eval-every", "0"))
    assert [r["n_kept"] for r in rows] == ["0", "0"] and [r["n_updates"] for r in rows] == ["0", "0"]
    assert not any(e["kept"] for e in episodes) and all(e["weight"] == 0 for e in episodes)
    assert abs(float(rows[1]["kl"])) < 1e-6  # LoRA's B is still 0: the policy is the reference


def test_cot_task_end_to_end(tmp_path, cot_toy):
    for label, extra in [("ippo", ["--filter-method", "i-ppo"]), ("sft", ["--no-train", "--filter-method", "none"])]:
        rows, episodes = run_variants(tmp_path, cot_flags(cot_toy, *extra, "--rounds", "2"), label)
        assert len(rows) == 2 and {"right", "faithful"} <= set(episodes[0])
        for r in rows:
            assert 0 <= float(r["eval_accuracy"]) <= 1 and r["eval_toxicity"] == ""
        for e in episodes:  # the reward is the outcome: 1 for a right answer
            a, b = map(int, e["prompt"].rstrip("=").split("+"))
            assert e["reward"] == float(e["right"]) == float(rlhf_variants.check(e["continuation"], a, b)[0])
            assert not e["faithful"] or e["right"]
    assert [r["n_updates"] for r in rows] == ["0", "0"]  # --no-train
    assert rows[0]["eval_accuracy"] == rows[1]["eval_accuracy"]  # never updated, tested with one seed
    final = json.load(open(tmp_path / label / "final.json"))  # the final policy: the last test's samples
    assert final["final_accuracy"] == float(rows[-1]["eval_accuracy"]) and final["final_kl"] == 0.0  # no update
    assert {"final_kl_se", "final_reward", "final_unfaithful", "n_test"} <= set(final)


def test_bad_flags_fail_early(tmp_path, toy, cot_toy):
    for cli, needle in [(cot_flags(cot_toy, "--filter-method", "i-ppo", "--validation-size", "500"), "--validation-size"),
                        (flags(toy, "--filter-method", "i-ppo", "--target-data", "validation"), "--target-data"),
                        ([a for a in cot_flags(cot_toy, "--filter-method", "i-ppo") if "validation.jsonl" not in a
                          and a != "--reference-dataset"], "--reference-dataset")]:
        with pytest.raises(SystemExit) as e:
            run_variants(tmp_path, [*cli, "--rounds", "1"])
        assert needle in str(e.value), (cli, e.value)


def test_killed_run_resumes_as_if_never_killed(toy, tmp_path):
    """A run killed (SIGKILL) during its 4th round continues with --resume from the checkpoint after its 3rd:
    metrics.csv (all but the timings) and episodes.jsonl are those of a run never killed"""
    def cmd(name, *extra):  # random filtering: its generator's state must come back too
        return [sys.executable, os.path.join(ROOT, "research", "rlhf_variants.py"), *flags(toy, "--runs-dir", str(tmp_path)),
                "--run-name", name, "--rounds", "5", "--filter-method", "random", "--eval-every", "2", *extra]
    run_variants(tmp_path / "whole", flags(toy, "--rounds", "5", "--filter-method", "random", "--eval-every", "2"))
    run = tmp_path / "killed"
    run_killed(cmd("killed"), "rlhf_iif", "ppo_update", 4, ENV)  # in its 4th round's update
    assert len(open(run / "metrics.csv").readlines()) == 4  # the header and 3 rounds
    assert torch.load(run / "checkpoint.pt", weights_only=False)["round"] == 2
    out = subprocess.run(cmd("killed", "--resume"), env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed after round" in out.stdout

    def rows(name):
        with open(tmp_path / name / "metrics.csv") as f:
            return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in csv.DictReader(f)]
    assert len(rows("whole/r")) == 5 and rows("killed") == rows("whole/r")
    assert open(run / "episodes.jsonl").read() == open(tmp_path / "whole" / "r" / "episodes.jsonl").read()
    assert json.load(open(run / "final.json")) == json.load(open(tmp_path / "whole" / "r" / "final.json"))


def test_resume_refuses_other_flags_and_a_finished_name_needs_it(tmp_path, toy):
    run_variants(tmp_path, flags(toy, "--rounds", "1", "--eval-every", "0"))
    with pytest.raises(SystemExit) as e:
        run_variants(tmp_path, flags(toy, "--rounds", "1", "--eval-every", "0"))
    assert "exists" in str(e.value)
    with pytest.raises(SystemExit) as e:
        run_variants(tmp_path, flags(toy, "--rounds", "1", "--eval-every", "0", "--resume", "--learning-rate", "1e-3"))
    assert "--learning-rate" in str(e.value) and "other flags" in str(e.value)
    with pytest.raises(SystemExit) as e:
        rlhf_variants.resolve_args(tyro.cli(rlhf_variants.Args, args=flags(toy, "--resume")))
    assert "--run-name" in str(e.value)


def test_without_its_flags_it_writes_what_rlhf_iif_writes(tmp_path, toy):
    """rlhf_variants.py with IIF's flags: rlhf_iif.py's metrics (every column but the timings) and episodes"""
    core = rlhf_iif.resolve_args(tyro.cli(rlhf_iif.Args, args=flags(toy, "--rounds", "2", "--runs-dir", str(tmp_path),
                                                                   "--run-name", "core")))
    rlhf_iif.main(core)
    rows, episodes = run_variants(tmp_path, flags(toy, "--rounds", "2"), "variants")
    core_rows = list(csv.DictReader(open(tmp_path / "core" / "metrics.csv")))
    assert [{k: v for k, v in r.items() if k in rlhf_iif.METRICS and not k.startswith("t_")} for r in rows] == \
        [{k: v for k, v in r.items() if not k.startswith("t_")} for r in core_rows]
    core_episodes = [json.loads(line) for line in open(tmp_path / "core" / "episodes.jsonl")]
    assert [{k: v for k, v in e.items() if k != "weight"} for e in episodes] == core_episodes
    assert json.load(open(tmp_path / "variants" / "final.json")) == json.load(open(tmp_path / "core" / "final.json"))


def test_analysis_ippo_draws_and_tabulates(tmp_path, cot_toy):
    for label, extra in [("sft", ["--no-train", "--filter-method", "none"]), ("none", ["--filter-method", "none"]),
                         ("i-ppo", ["--filter-method", "i-ppo"])]:
        run_variants(tmp_path, cot_flags(cot_toy, *extra, "--rounds", "3"), f"t-cot__{label}__1")
    out = tmp_path / "ippo.png"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "research", "analysis_variants.py"), "ippo", "--runs", str(tmp_path),
                           "--env", "t-cot", "--last", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.stat().st_size > 10_000 and (tmp_path / "ippo_kept.png").stat().st_size > 5_000
    lines = proc.stdout.splitlines()
    assert any(line.startswith("| I-PPO | 1 |") for line in lines) and any(line.startswith("| PPO | 1 |") for line in lines)
    assert any(line.startswith("| PPO (1 seeds) |") for line in lines)  # I-PPO minus PPO, seed by seed
    # each column with its p, Holm p and verdict (one seed: no test, so no verdict)
    assert any(line.startswith("| against | final reward | p | Holm p | verdict | test accuracy |") for line in lines)
    assert any(line.startswith("| PPO (1 seeds) |") and line.endswith("| - | - | not detected over 1 seed |")
               for line in lines)
