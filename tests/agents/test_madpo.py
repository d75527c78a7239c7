"""MADPOTrainer on tiny offline models: DPO against a frozen reference, rounds, sources, resume."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from test_run_invariants import assert_identical, record_evaluations
from test_run_invariants import weights as all_weights

from cmlrl_agents import MADPOConfig, MADPOIterConfig, MADPOTrainer
from cmlrl_agents.algorithms.preference_pairs import load_pairs, save_pairs
from cmlrl_agents.testing import SyncRecorder, tiny_agent
from cmlrl_env import tasks

FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]
AGENTS = ["agent_0", "agent_1"]


def make_trainer(tmp_path, name="run", *, task_reward=True, **kw):
    sources = {k: kw.pop(k) for k in ("preference_func", "comparator", "pairs_file") if k in kw}
    train, evaluation = tasks.length_ratio_splits()
    defaults = dict(
        num_agents=2,
        max_new_tokens=6,
        eval_num_samples=2,
        agent_learning_rate=1e-3,
        pair_batch_size=8,
        seed=0,
        output_dir=str(tmp_path / name),
    )
    return MADPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward if task_reward else None,
        train_dataset=kw.pop("train_dataset", train),
        eval_dataset=evaluation if task_reward else None,
        args=MADPOConfig(**{**defaults, **kw}),
        **sources,
    )


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(trainer):
    return [copy.deepcopy(a.model.state_dict()) for a in trainer.agents]


def test_one_round_changes_the_policy_not_the_reference_and_logs_its_metrics(tmp_path):
    trainer = make_trainer(tmp_path)
    before = weights(trainer)
    reference = [copy.deepcopy(r.state_dict()) for r in trainer.reference_models]
    trainer.train()
    for agent, old in zip(trainer.agents, before, strict=True):
        changed = [not torch.equal(p.detach(), old[n]) for n, p in agent.model.named_parameters()]
        assert all(changed)
    for ref, old in zip(trainer.reference_models, reference, strict=True):
        assert all(torch.equal(v, old[k]) for k, v in ref.state_dict().items())
    logged = rows(tmp_path / "run")
    keys = set().union(*logged)
    for key in ("loss", "dpo/accuracy", "dpo/margin", "dpo/chosen_reward", "dpo/rejected_reward"):
        assert key in keys
    assert {"preference/pairs", "turn_1/reward_mean", "eval/turn_1/reward_mean"} <= keys
    # 8 training items x 4 joint candidates scored by the env; DPO steps score none.
    assert trainer.env_step == 32 and logged[-1]["env_step"] == 32
    assert all(math.isfinite(r["loss"]) for r in logged if "loss" in r)
    assert len(load_pairs(tmp_path / "run" / "preference" / "pairs-000.jsonl", AGENTS)) > 0


@pytest.mark.parametrize("bf16", [False, True])
def test_the_first_step_starts_at_the_reference(tmp_path, bf16):
    # Under bf16 the reference log-probs are scored under the loss's autocast: the same
    # function, so the first margin is still exactly 0.
    trainer = make_trainer(tmp_path, bf16=bf16)
    pairs = trainer.build_pairs(0)
    stats = trainer.learner.step(trainer.learner.prepare(pairs), range(len(pairs)))
    # pi == pi_ref: every log-ratio is 0, so the margin is 0 and the loss log 2.
    assert stats["margin"] == 0.0 and stats["accuracy"] == 0.0
    assert stats["loss"] == pytest.approx(math.log(2.0), abs=1e-6)


def test_rounds_regenerate_pairs_from_the_updated_policy_and_replay_earlier_ones(tmp_path):
    trainer = make_trainer(tmp_path, num_iterations=2, replay_iterations=1, eval_interval=0)
    trainer.train()
    folder = tmp_path / "run" / "preference"
    first, second = (load_pairs(folder / f"pairs-00{k}.jsonl", AGENTS) for k in (0, 1))
    assert first != second
    assert trainer.env_step == 64  # two rounds of 8 items x 4 candidates
    dpo = [r for r in rows(tmp_path / "run") if "loss" in r]
    assert [r["preference/iteration"] for r in dpo] == [0.0, 1.0]
    assert dpo[1]["preference/train_pairs"] == len(first) + len(second)
    assert dpo[1]["preference/replay_pairs"] == len(first)
    assert dpo[0]["env_step"] == 32 and dpo[1]["env_step"] == 64


def test_resume_from_the_first_round_matches_the_uninterrupted_run(tmp_path):
    config = dict(num_iterations=2, num_train_epochs=2, save_steps=1, eval_interval=0)
    full = make_trainer(tmp_path, **config)
    full.train()
    checkpoints = sorted(
        (tmp_path / "run" / "checkpoints").iterdir(), key=lambda p: p.stat().st_mtime
    )
    assert len(checkpoints) == 4  # after each DPO epoch (the last one also ends the run)
    resumed = make_trainer(tmp_path, **config)
    resumed.train(resume_from_checkpoint=checkpoints[0])  # round 0, one of two epochs done
    for a, b in zip(full.agents, resumed.agents, strict=True):
        for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
            torch.testing.assert_close(p, q, msg=name)
    assert resumed.env_step == full.env_step == 64


def test_preference_func_labels_pairs_without_a_task_reward(tmp_path):
    def longer_first(joint_a, joint_b, item):
        a, b = len("".join(joint_a)), len("".join(joint_b))
        return (a > b) - (a < b)

    trainer = make_trainer(
        tmp_path, task_reward=False, preference_func=longer_first, pair_selection="random"
    )
    before = weights(trainer)
    trainer.train()
    assert trainer.evaluate() == {}
    pairs = load_pairs(tmp_path / "run" / "preference" / "pairs-000.jsonl", AGENTS)
    assert all(len("".join(p.chosen)) > len("".join(p.rejected)) for p in pairs)
    assert {p.source for p in pairs} == {"preference_func"}
    keys = set().union(*rows(tmp_path / "run"))
    assert "loss" in keys and "turn_1/reward_mean" not in keys  # no task reward to report
    assert not torch.equal(trainer.agents[0].model.lm_head.weight, before[0]["lm_head.weight"])


class KeyedJudge:
    """A comparator holding a credential, as a client of a remote judge would."""

    def __init__(self) -> None:
        self.api_key = "sk-" + "z9y8x7w6" * 4

    def __call__(self, joint_a, joint_b, item):
        return 1 if joint_a[0].count("a") >= joint_b[0].count("a") else -1


def test_a_comparators_key_never_reaches_checkpoints_or_logs(tmp_path):
    judge = KeyedJudge()
    trainer = make_trainer(
        tmp_path,
        comparator=judge,
        pair_selection="all",
        preference_pairs_per_sample=None,
        save_steps=1,
    )
    trainer.train()
    trainer.close()
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any("checkpoint" in str(p) for p in files)
    for path in files:
        assert judge.api_key.encode() not in path.read_bytes(), path


def test_a_pairs_file_trains_without_a_dataset(tmp_path):
    source = make_trainer(tmp_path, "source")
    pairs = source.build_pairs(0)
    path = save_pairs(
        tmp_path / "labels.jsonl",
        [p.__class__(p.prompts, p.chosen, p.rejected) for p in pairs],
        AGENTS,
    )
    trainer = MADPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        pairs_file=path,
        args=MADPOConfig(agent_learning_rate=1e-3, eval_interval=0, output_dir=str(tmp_path / "f")),
    )
    before = weights(trainer)
    trainer.train()
    assert not torch.equal(trainer.agents[1].model.lm_head.weight, before[1]["lm_head.weight"])
    (dpo,) = [r for r in rows(tmp_path / "f") if "loss" in r]
    assert dpo["preference/train_pairs"] == len(pairs)
    # Later rounds sample their pairs from the policy: without a dataset, refused at once.
    with pytest.raises(ValueError, match="num_iterations=2: rounds after the first build pairs"):
        MADPOTrainer(
            agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
            pairs_file=path,
            args=MADPOConfig(num_iterations=2, output_dir=str(tmp_path / "g")),
        )


def test_all_ties_are_refused_with_the_fix(tmp_path):
    trainer = MADPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=FORMATTERS,
        reward_func=lambda a, b: [1.0] * len(a),
        train_dataset=tasks.length_ratio_splits()[0],
        args=MADPOConfig(max_new_tokens=4, eval_interval=0, output_dir=str(tmp_path / "t")),
    )
    with pytest.raises(ValueError, match=r"no preference pair: .* same task reward \(all ties\)"):
        trainer.train()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(task_reward=False), "no preference source"),
        (dict(preference_func=lambda a, b, i: 1, comparator=lambda a, b, i: 1), "not both"),
        (dict(preference_func="longer"), "preference_func must be callable"),
        (dict(preference_func=lambda a, b, i: 1), "pair_selection='reward_gap' ranks pairs"),
    ],
)
def test_bad_sources_are_refused_at_construction(tmp_path, kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make_trainer(tmp_path, **kwargs)


def test_eval_without_a_task_reward_and_config_errors(tmp_path):
    with pytest.raises(ValueError, match="evaluation scores the policy with the task reward"):
        MADPOTrainer(
            agents=[tiny_agent(seed=0)],
            preference_func=lambda a, b, i: 1,
            formatters=[tasks.brief_formatter],
            train_dataset=tasks.length_ratio_splits()[0],
            eval_dataset=tasks.length_ratio_splits()[1],
            args=MADPOConfig(pair_selection="all", preference_pairs_per_sample=None),
        )
    with pytest.raises(ValueError, match="use num_turns=1"):
        MADPOConfig(num_turns=2)
    with pytest.raises(ValueError, match="set it to None"):
        MADPOConfig(pair_selection="all")
    with pytest.raises(ValueError, match="dpo_beta must be > 0"):
        MADPOConfig(dpo_beta=0)
    assert MADPOIterConfig is MADPOConfig


def test_keywords_madpo_does_not_take_are_refused_by_name():
    for keyword in ("external_transition", "formatter"):
        with pytest.raises(TypeError, match=keyword):
            MADPOTrainer(agents=[tiny_agent(seed=0)], **{keyword: object()})


def test_pairs_are_sampled_with_each_agents_settings_through_the_trainers_backend(tmp_path):
    trainer = make_trainer(
        tmp_path,
        agent_sampling=[{"temperature": 0.5}, {"temperature": 1.3, "top_k": 7}],
        eval_interval=0,
    )
    seen = []
    backend = trainer.generation_backend
    generate = backend.generate

    def spy(agents, requests):
        seen.extend((r.agent, r.sampling.temperature, r.sampling.top_k, r.keys) for r in requests)
        return generate(agents, requests)

    backend.generate = spy
    trainer.build_pairs(0)
    assert {(a, t, k) for a, t, k, _ in seen} == {(0, 0.5, 50), (1, 1.3, 7)}
    assert all(keys is not None for *_, keys in seen)  # drawn from the run's pair keys


def test_each_round_generates_after_the_backend_synced_the_last_rounds_update(tmp_path):
    trainer = make_trainer(tmp_path, num_iterations=2, eval_interval=0)
    trainer.generation_backend = spy = SyncRecorder(trainer.generation_backend)
    trainer.train()
    # Round 0's pairs before any update, round 1's after round 0's sync; one sync per round.
    assert sorted(set(spy.calls)) == [0, 1] and spy.syncs == 2


def test_the_best_model_is_kept_and_loaded_at_the_end(tmp_path):
    trainer = make_trainer(
        tmp_path,
        num_iterations=3,
        eval_interval=1,
        save_best_by="eval/turn_1/reward_mean",
        load_best_model_at_end=True,
    )
    seen = record_evaluations(trainer)
    trainer.train()
    assert len(seen) == 4  # before each of the 3 rounds, then the end
    best_value, best_weights = max(seen, key=lambda pair: pair[0])  # the first of equal maxima
    assert trainer.best_metric == best_value
    assert_identical(all_weights(trainer), best_weights)
    assert (tmp_path / "run" / "best").is_dir()
