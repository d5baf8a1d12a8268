"""IIFGRPOTrainer in a TRL user's own GRPO script: GRPOTrainer's arguments, IIF's settings as keywords, and the
guarantees the trainer keeps itself. The tiny GPT-2 of tests/conftest.py keeps GPT-2's dropout (0.1), as a
user's model would; the GRPOConfig is TRL's default but for its size (offline, on the CPU)."""
import contextlib
import copy
import os
import subprocess
import sys

import pytest
import torch
from accelerate.utils import DistributedType

import grpo_iif

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["cats", "dogs", "rain", "tea", "maps", "bees", "jazz", "snow"]


def reward_letter(completions, letter, **kwargs):
    """The user's reward: how often the completion uses the letter of its row (a column of the user's own,
    which TRL hands to reward functions), shorter completions preferred"""
    return [c.count(ch) - 0.01 * len(c) for c, ch in zip(completions, letter)]


def user_script(toy, out, trainer_cls=None, lora=True, train=True, iif=None, **config):
    """What a TRL user writes, in TRL's names: their prompts, their reward function, a GRPOConfig (TRL's
    defaults but for the size: 2 steps of 2 prompts x 4 completions of 12 tokens, for the tiny model's 128
    positions), a LoraConfig or none, and GRPOTrainer(...).train(). trainer_cls: IIFGRPOTrainer in place of
    GRPOTrainer, with IIF's keywords iif."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    dataset = Dataset.from_list([{"prompt": f"Tell me about {w}:", "letter": w[0]} for w in WORDS * 2])
    tokenizer = AutoTokenizer.from_pretrained(toy / "policy")
    model = AutoModelForCausalLM.from_pretrained(toy / "policy")
    args = GRPOConfig(output_dir=str(out), use_cpu=True, max_steps=2, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=12, logging_steps=1, **config)
    torch.manual_seed(0)  # LoRA's initial weights
    trainer = (trainer_cls or GRPOTrainer)(
        model=model, reward_funcs=reward_letter, args=args, train_dataset=dataset, processing_class=tokenizer,
        peft_config=LoraConfig(task_type="CAUSAL_LM") if lora else None, **iif or {})
    if train:
        trainer.train()
    return trainer


def trained(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def max_difference(a, b):
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


@pytest.fixture(scope="module")
def plain(toy, tmp_path_factory):
    """TRL's GRPOTrainer's weights after the user's script, with LoRA and without (learning rate 1e-3, so that
    two steps move them well above float32's resolution)"""
    from transformers import AutoModelForCausalLM
    out, initial = tmp_path_factory.mktemp("plain"), AutoModelForCausalLM.from_pretrained(toy / "policy")
    weights = {lora: trained(user_script(toy, out / str(lora), lora=lora, learning_rate=1e-3))
               for lora in (True, False)}
    assert any((p != 0).any() for n, p in weights[True].items() if "lora_B" in n)  # B starts at 0
    assert max_difference(weights[False], dict(initial.named_parameters())) > 1e-4
    return weights


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_filter_p_0_trains_plain_grpos_weights_with_dropout_on(toy, tmp_path, plain, capsys, lora):
    """filter_p=0 scores every completion and drops none: with GPT-2's dropout on, the weights after two steps
    equal plain GRPOTrainer's bit for bit, as the scoring (in eval mode) leaves the global random state and every
    module's train/eval mode as they were. The scoring's path is said once; IIF's numbers reach TRL's log."""
    from trl import GRPOTrainer
    trainer = user_script(toy, tmp_path, grpo_iif.IIFGRPOTrainer, lora=lora, iif=dict(filter_p=0.0),
                          learning_rate=1e-3)
    assert not trainer.args.disable_dropout and any(
        isinstance(m, torch.nn.Dropout) and m.p > 0 for m in trainer.model.modules())
    out = capsys.readouterr().out
    assert out.count("IIF: influence ") == 1
    assert ("from the LoRA layers' activations" if lora else "in forward mode over every trained parameter") in out
    weights = trained(trainer)
    print(f"{'LoRA' if lora else 'full'}, dropout on, filter_p=0 against GRPOTrainer: max |weight difference| "
          f"= {max_difference(weights, plain[lora]):.1e} over {sum(p.numel() for p in weights.values()):,} "
          f"trained weights")
    assert all(torch.equal(weights[n], plain[lora][n]) for n in weights)
    assert isinstance(trainer, GRPOTrainer) and trainer.model.training
    logged = [e for e in trainer.state.log_history if "iif/n_kept" in e]
    assert len(logged) == 2 and all(e["iif/kept_fraction"] == 1.0 and "iif/n_negative" in e for e in logged)


def test_scoring_in_training_mode_would_break_the_equality(toy, tmp_path, plain, monkeypatch):
    """The check above sees the guarantee: with the scoring left in training mode (the guard taken out), dropout
    draws from the global random state while scoring, and the weights differ from plain GRPO's"""
    monkeypatch.setattr(grpo_iif, "dropout_off_random_state_kept", lambda model: contextlib.nullcontext())
    trainer = user_script(toy, tmp_path, grpo_iif.IIFGRPOTrainer, iif=dict(filter_p=0.0), learning_rate=1e-3)
    difference = max_difference(trained(trainer), plain[True])
    print(f"LoRA, dropout on, filter_p=0, scored in training mode: max |weight difference| = {difference:.1e}")
    assert difference > 0


def test_trls_default_config_runs_with_only_the_class_swapped(toy, tmp_path, capsys, monkeypatch):
    """TRL's default GRPOConfig (beta 0, dropout on, bf16, dapo) and no IIF keyword: it trains, filters, scores
    under bf16 autocast as TRL's update runs, reads beta, epsilon and the seed from the config, says its scoring
    path once and warns once that the update's dropout is not in the scores"""
    bf16_flags, real = [], grpo_iif.completion_logprobs

    def recorded(model, b, idx, params=None, bf16=False):
        bf16_flags.append(bf16)
        return real(model, b, idx, params, bf16)
    monkeypatch.setattr(grpo_iif, "completion_logprobs", recorded)
    with pytest.warns(UserWarning, match="disable_dropout=False") as warned:
        trainer = user_script(toy, tmp_path, grpo_iif.IIFGRPOTrainer)
    args, config = trainer.iif_args, trainer.args
    assert config.bf16 and config.beta == 0.0 and config.loss_type == "dapo" and not config.disable_dropout
    assert (args.filter_method, args.filter_p, args.target, args.forward_batch_size) == ("influence", None, "f_seq", 16)
    assert (args.beta, args.epsilon, args.seed, args.dtype) == (0.0, config.epsilon, config.seed, "bfloat16")
    assert bf16_flags and all(bf16_flags)
    assert sum("disable_dropout" in str(w.message) for w in warned) == 1
    assert capsys.readouterr().out.count("IIF: influence from the LoRA layers' activations") == 1
    kept = [e["iif/n_kept"] for e in trainer.state.log_history if "iif/n_kept" in e]
    assert len(kept) == 2 and all(0 <= k <= 8 for k in kept)
    assert trainer.state.global_step == 2


def test_the_scoring_guard_restores_mode_and_random_state(toy):
    """dropout_off_random_state_kept: dropout off inside; afterwards each module's own mode (a mixed one here)
    and the CPU random state as they were, whatever the scoring drew"""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(toy / "policy").train()
    model.transformer.h[0].eval()
    modes = [m.training for m in model.modules()]
    state = torch.get_rng_state()
    ids = torch.arange(10)[None]
    with grpo_iif.dropout_off_random_state_kept(model):
        assert not any(m.training for m in model.modules())
        assert torch.equal(model(ids).logits, model(ids).logits)  # no dropout
        torch.rand(5)
    assert [m.training for m in model.modules()] == modes and torch.equal(torch.get_rng_state(), state)


@pytest.fixture(scope="module")
def built(toy, tmp_path_factory):
    """An IIFGRPOTrainer with LoRA and one without, built but not trained"""
    out = tmp_path_factory.mktemp("built")
    with pytest.warns(UserWarning):
        return {lora: user_script(toy, out / str(lora), grpo_iif.IIFGRPOTrainer, lora=lora, train=False)
                for lora in (True, False)}


@pytest.mark.parametrize("setting,value", [
    ("loss_type", "grpo"), ("loss_type", "bnpo"), ("loss_type", "dr_grpo"), ("importance_sampling_level", "sequence"),
    ("top_entropy_quantile", 0.2), ("temperature", 0.7), ("use_bias_correction_kl", False), ("entropy_coef", 0.01),
    ("fp16", True), ("use_vllm", True)])
def test_a_loss_the_scores_are_not_of_is_refused_naming_it(built, monkeypatch, setting, value):
    """Each GRPOConfig setting under which a completion's score would not be that of TRL's loss stops the
    trainer at construction, naming the setting (beta > 0 where the KL's form matters)"""
    trainer = built[True]
    config = copy.copy(trainer.args)
    setattr(config, setting, value)
    config.beta = 0.04 if setting == "use_bias_correction_kl" else config.beta
    monkeypatch.setattr(trainer, "args", config)
    with pytest.raises(ValueError, match=setting):
        grpo_iif.settings_from_config(trainer, grpo_iif.Args())


@pytest.mark.parametrize("bf16", [True, False])
def test_beta_epsilon_bf16_and_seed_are_the_configs(built, monkeypatch, bf16):
    """IIF's copies of beta, epsilon, the seed and bf16 (the scoring's autocast) follow the trainer's GRPOConfig,
    whatever IIF's Args held"""
    config = copy.copy(built[True].args)
    config.bf16, config.beta, config.epsilon, config.seed = bf16, 0.1, 0.3, 7
    monkeypatch.setattr(built[True], "args", config)
    args = grpo_iif.Args(beta=0.04, epsilon=0.2, seed=1, dtype="float32" if bf16 else "bfloat16")
    with pytest.warns(UserWarning):
        a = grpo_iif.settings_from_config(built[True], args)
    assert (a.beta, a.epsilon, a.seed, a.dtype) == (0.1, 0.3, 7, "bfloat16" if bf16 else "float32")


def test_loss_type_grpo_stops_the_construction(toy, tmp_path):
    with pytest.raises(ValueError, match="loss_type='grpo'.*'dapo'"):
        user_script(toy, tmp_path, grpo_iif.IIFGRPOTrainer, train=False, loss_type="grpo")


@pytest.mark.parametrize("kind", [DistributedType.FSDP, DistributedType.DEEPSPEED])
def test_sharded_full_fine_tuning_is_refused(built, monkeypatch, capsys, kind):
    """Under FSDP or DeepSpeed the scores come from LoRA layers' activations: the whole model training is refused,
    naming the setting, unless nothing is scored; LoRA is accepted"""
    monkeypatch.setattr(type(built[False].accelerator), "distributed_type", property(lambda self: kind))
    with pytest.raises(ValueError, match=f"filter_method 'influence' under {kind.value}.*peft_config"):
        grpo_iif.settings_from_config(built[False], grpo_iif.Args(filter_method="influence"))
    grpo_iif.settings_from_config(built[False], grpo_iif.Args(filter_method="none"))
    with pytest.warns(UserWarning):
        grpo_iif.settings_from_config(built[True], grpo_iif.Args(filter_method="influence"))
    assert built[True].sharded and "LoRA layers' activations" in capsys.readouterr().out


@pytest.mark.parametrize("keywords,needle", [
    (dict(filter_method="best"), "filter_method must be 'influence', 'random' or 'none', got 'best'"),
    (dict(filter_p=1.5), "filter_p must be None or in [0, 1], got 1.5"),
    (dict(filter_p=0.5, filter_method="none"), "filter_p is for filter_method influence or random"),
    (dict(target="f_return"), "target must be 'f_seq' or 'f_loss', got 'f_return'"),
    (dict(forward_batch_size=0), "forward_batch_size must be None or at least 1, got 0")])
def test_bad_keywords_fail_before_trl_builds_anything(monkeypatch, keywords, needle):
    import trl
    monkeypatch.setattr(trl.GRPOTrainer, "__init__", lambda *a, **kw: pytest.fail("TRL's __init__ ran"))
    with pytest.raises(ValueError) as e:
        grpo_iif.IIFGRPOTrainer(model=None, reward_funcs=None, **keywords)
    assert needle in str(e.value)


def test_importing_the_trainer_needs_no_tyro():
    code = ("import sys; sys.modules['tyro'] = None; sys.path.insert(0, 'research'); "
            "from grpo_iif import IIFGRPOTrainer; print(IIFGRPOTrainer.__mro__[1].__name__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"))
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "GRPOTrainer", proc.stderr[-2000:]
