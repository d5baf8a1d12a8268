"""iif.py against iif_variants.py: with no variant flag set, the two write the same run; both rerun committed
runs exactly."""
import csv
import dataclasses
import os

import pytest
import torch
import tyro

import iif
import iif_variants as variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--num-steps", "64", "--minibatch-size", "32", "--update-epochs", "2", "--total-timesteps", "128",
        "--eval-episodes", "2", "--save-rounds"]


def rows(path, n=None):
    """metrics.csv but the timings, and the agreement guard's column where it is empty (iif.py has no guard)"""
    with open(path) as f:
        return [{k: v for k, v in r.items() if not k.startswith("t_") and not (k == "agreement" and v == "")}
                for r in csv.DictReader(f)][:n]


def same(a, b):
    """Tensors equal bitwise, dicts key by key, everything else by =="""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def run(module, runs_dir, flags):
    args = module.resolve_args(tyro.cli(module.Args, args=["--runs-dir", str(runs_dir), "--run-name", "r", *flags]))
    module.main(args)
    return runs_dir / "r"


@pytest.mark.parametrize("env_id, flags", [
    ("FrozenLake-v1", []), ("MiniGrid-Empty-8x8-v0", ["--filter-method", "random"]),
    ("highway-v0", []), ("LunarLander-v3", ["--env-backend", "gymnasium"]), ("BipedalWalker-v3", []),
    ("CartPole-v1", []), ("CartPole-v1", ["--filter-method", "influence"]),  # no filter; every round filtered
])
def test_iif_py_writes_what_iif_variants_py_writes_without_variant_flags(tmp_path, env_id, flags):
    a = run(iif, tmp_path / "iif", ["--env-id", env_id, *TINY, *flags, "--save-model"])
    b = run(variants, tmp_path / "variants", ["--env-id", env_id, *TINY, *flags])
    assert rows(a / "metrics.csv") == rows(b / "metrics.csv") and len(rows(a / "metrics.csv")) == 2
    assert same(torch.load(a / "iif.cleanrl_model"), torch.load(b / "agent.pt"))
    for k in (0, 1):
        ra, rb = (torch.load(d / "rounds" / f"round_000{k}.pt", weights_only=False) for d in (a, b))
        assert same(ra, rb)
    assert int(rows(a / "metrics.csv")[0]["n_kept"]) <= 64


@pytest.mark.parametrize("module, run_dir", [
    (iif, "results/runs/FrozenLake-v1__influence__1"),  # made before the split; iif.py fixes its other flags
    (variants, "results/generic/target-normalized/CartPole-v1__influence__1"),  # a variant flag
    (variants, "results/ablation/first-release/FrozenLake-v1__influence__1"),  # a config.json older than the flags
])
def test_committed_runs_rerun_identically(tmp_path, module, run_dir):
    import analysis_variants
    config = analysis_variants.load_config(os.path.join(ROOT, run_dir))  # every flag, as results/rerun_check.py
    names = {f.name for f in dataclasses.fields(module.Args)} - set(variants.NOT_COMPARED) - {"run_name", "runs_dir"}
    if module is iif:  # the values iif.py fixes
        assert {k: config[k] for k in ("adv_norm", "target_adv", "influence_loss", "filter_ties", "score_log_std",
                                       "reseed_rounds", "target", "eval_every", "eval_envs")} == dict(
            adv_norm="minibatch", target_adv="raw", influence_loss="policy", filter_ties="keep", score_log_std=True,
            reseed_rounds=False, target="f_return", eval_every=1, eval_envs=16)
    args = module.Args(**{k: config[k] for k in names if k in config}, runs_dir=str(tmp_path), run_name="r")
    args.total_timesteps = 2 * config["num_steps"]
    module.main(module.resolve_args(args))
    old = rows(os.path.join(ROOT, run_dir, "metrics.csv"), 2)
    new = rows(tmp_path / "r" / "metrics.csv")
    # kl: a float32 pass over the whole buffer, whose matrix kernels round differently on other CPUs, and
    # (r - 1) - log r loses digits near r = 1 (as results/rerun_check.py, 1e-3 relative); every other column,
    # training included, is bit for bit the committed run's
    for r_new, r_old in zip(new, old):
        if r_old.get("kl"):
            assert float(r_new.pop("kl")) == pytest.approx(float(r_old.pop("kl")), rel=1e-3)
    assert [{k: r[k] for k in old[0]} for r in new] == old
