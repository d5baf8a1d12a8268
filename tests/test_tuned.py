"""results/tuned.py: which rate the grid of a method gains when its best rate lies at the grid's edge."""
import csv
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results"))
import tuned  # noqa: E402


def write(runs, method, m, seed, area, rounds=50):
    path = runs / f"FrozenLake-v1__{tuned.label(method, m)}__{seed}"
    os.makedirs(path)
    with open(path / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["round", "test_return_mean"])
        w.writeheader()
        w.writerows(dict(round=k, test_return_mean=area) for k in range(rounds))


@pytest.mark.parametrize("areas, expected", [({1: .1, 3: .2, 10: .3}, 20), ({1: .3, 3: .2, 10: .1}, 0.3),
                                             ({1: .1, 3: .3, 10: .2}, None)])
def test_edge_rate(tmp_path, monkeypatch, areas, expected):
    monkeypatch.setattr(tuned, "RUNS", str(tmp_path))
    monkeypatch.setattr(tuned.sc, "picked", lambda: {"FrozenLake-v1": 10})  # the KL-matched multiple
    for m, area in areas.items():
        for seed in (1, 2, 3):
            write(tmp_path, "influence", m, seed, area)
    assert tuned.grid("FrozenLake-v1", "influence") == [1, 3, 10]
    assert tuned.edge_rate("FrozenLake-v1", "influence") == expected


def test_an_unfinished_or_diverged_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "RUNS", str(tmp_path))
    monkeypatch.setattr(tuned.sc, "picked", lambda: {"FrozenLake-v1": 10})
    for m, area in {1: .1, 3: .2, 10: .3}.items():
        for seed in (1, 2, 3):
            write(tmp_path, "none", m, seed, area, rounds=50 if (m, seed) != (10, 3) else 20)
    assert tuned.state("FrozenLake-v1", "none", 10, 3) == "partial 20"
    assert tuned.edge_rate("FrozenLake-v1", "none") is None  # not every run is finished
    write(tmp_path, "none", 20, 1, .4)
    (tmp_path / f"FrozenLake-v1__{tuned.label('none', 20)}__2.err").write_text("non-finite PPO loss")
    assert tuned.grid("FrozenLake-v1", "none") == [1, 3, 10, 20]  # the added rate's seed 1 marks it
    assert tuned.state("FrozenLake-v1", "none", 20, 2) == "diverged"
    assert tuned.area("FrozenLake-v1", "none", 20) == float("-inf")


@pytest.mark.parametrize("seeds, trained_edge", [([1, 2, 3], True), ([2, 3], False)])
def test_only_a_runner_with_seed_1_adds_an_edge_rate(tmp_path, monkeypatch, seeds, trained_edge):
    """Two runners side by side with disjoint seeds must not both train seed 1 of a new rate."""
    monkeypatch.setattr(tuned, "RUNS", str(tmp_path))
    monkeypatch.setattr(tuned.sc, "picked", lambda: {"FrozenLake-v1": 10})
    monkeypatch.setattr(tuned, "link_committed", lambda env_id: None)
    for method in tuned.METHODS:
        for m, area in {1: .1, 3: .2, 10: .3}.items():
            for seed in (1, 2, 3):
                write(tmp_path, method, m, seed, area)
    calls = []

    def train(env_id, method, m, seed):  # every run of the grid is finished; a new one finishes at once
        calls.append((method, m, seed))
        if not os.path.exists(tmp_path / f"{env_id}__{tuned.label(method, m)}__{seed}"):
            write(tmp_path, method, m, seed, .1)
        return True
    monkeypatch.setattr(tuned, "train", train)
    tuned.stage_run(["FrozenLake-v1"], seeds)
    new = sorted({c for c in calls if c[1] == 20})  # a finished run is passed again; train skips it
    if trained_edge:  # seed 1 first, then the runner's other seeds; 20 x is then not best: done
        assert new == [("influence", 20, 1), ("influence", 20, 2), ("influence", 20, 3),
                       ("none", 20, 1), ("none", 20, 2), ("none", 20, 3)]
    else:
        assert new == []


def test_leave_one_seed_out_scores_each_seed_at_the_rates_the_others_picked():
    """Standard PPO's rate 3 is best on average only through seed 1's luck: left out, seed 1 is scored at rate 1, the
    rate seeds 2 and 3 pick; IIF's rate 1 is best on every fold"""
    import analysis_variants

    def rows(area):
        return [dict(test_return_mean=area)]
    area = {"none": {1: {"1": 0.0, "2": 5.0, "3": 5.0}, 3: {"1": 30.0, "2": 4.0, "3": 4.0}},
            "influence": {1: {"1": 6.0, "2": 7.0, "3": 8.0}, 3: {"1": 0.0, "2": 0.0, "3": 0.0}}}
    runs = {mt: {m: {s: rows(a) for s, a in seeds.items()} for m, seeds in by_m.items()} for mt, by_m in area.items()}
    diff, picks = analysis_variants.leave_one_seed_out(runs, {mt: list(area[mt]) for mt in area})
    # seed 1: standard at 1 (picked by 2, 3), IIF at 1: 6 - 0; seed 2: standard at 3 (seeds 1, 3: 17 > 2.5): 7 - 4;
    # seed 3: standard at 3: 8 - 4
    assert diff == [6.0, 3.0, 4.0] and picks == {"none": ["1", "3", "3"], "influence": ["1", "1", "1"]}
    runs = {mt: {m: {s: r for s, r in seeds.items() if s != "3"} for m, seeds in by_m.items()} for mt, by_m in runs.items()}
    assert analysis_variants.leave_one_seed_out(runs, {mt: list(area[mt]) for mt in area})[0] == []  # 2 seeds: none
