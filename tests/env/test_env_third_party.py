"""The env with the libraries that consume PettingZoo and Gymnasium envs, with no user shim."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import gymnasium
import pytest
import supersuit as ss
from datasets import Dataset
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from cmlrl_env import CoMLRLEnv, as_gymnasium
from cmlrl_env.gymnasium_view import GYMNASIUM_ID, make_gymnasium_env
from cmlrl_env.tasks import feedback_dataset

PROMPTS = [f"Question {i}: café, 中文 or 🙂?" for i in range(10)]


def longer_second(c1: list[str], c2: list[str]) -> list[float]:
    return [float(len(b) > len(a)) for a, b in zip(c1, c2, strict=True)]


quiz_env = functools.partial(CoMLRLEnv, Dataset.from_dict({"prompt": PROMPTS}), None, longer_second)
PARTNERS = {"agent_1": lambda prompt: "a partner's longer answer"}


# -- SuperSuit ------------------------------------------------------------------------------------
def test_supersuit_concat_vec_envs_steps_and_auto_resets_with_no_shim() -> None:
    vec = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(quiz_env()), 3)
    obs, infos = vec.reset(seed=5)  # copies seeded 5, 6, 7
    assert vec.num_envs == 6 and all(isinstance(o, str) for o in obs)
    assert obs == tuple(p for p in PROMPTS[5:8] for _ in range(2))
    assert [i["item_index"] for i in infos] == [5, 5, 6, 6, 7, 7]
    for step in range(1, 4):
        obs, rewards, terms, truncs, infos = vec.step(["a", "bb"] * 3)
        assert rewards.tolist() == [1.0] * 6 and terms.all() and not truncs.any()
        # auto-reset: each copy moved on to its next item, never in lock-step with another
        assert obs[::2] == tuple(PROMPTS[(5 + i + step) % 10] for i in range(3))
        assert infos[0]["terminal_observation"] == PROMPTS[5 + step - 1]


def test_supersuit_two_turn_episodes_auto_reset_after_the_task_ends(feedback_env) -> None:
    vec = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(feedback_env()), 2)
    vec.reset(seed=0)
    _, _, terms, _, _ = vec.step(["Clouds.", "Clouds, too."] * 2)
    assert not terms.any()
    obs, _, terms, truncs, infos = vec.step(["Clouds.", "Clouds, rain and sun."] * 2)
    assert terms.all() and not truncs.any()
    assert obs[::2] == tuple(r["prompt"] for r in feedback_dataset().select([1, 2]))
    assert "Your last answer had" in infos[0]["terminal_observation"]


# -- Gymnasium ------------------------------------------------------------------------------------
def test_gymnasium_check_env_passes_on_the_view_with_no_warnings(feedback_env) -> None:
    for env_fn in (quiz_env, feedback_env):
        env = gymnasium.make(GYMNASIUM_ID, env_fn=env_fn, partners=PARTNERS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gymnasium_check_env(env.unwrapped)  # with a spec: re-made in every render mode
        assert [str(w.message) for w in caught] == []


def test_gymnasium_check_env_on_a_view_built_directly(feedback_env) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gymnasium_check_env(as_gymnasium(feedback_env(), partners=PARTNERS))
    # The only warning says that an env not built by gymnasium.make has no spec.
    assert [str(w.message) for w in caught if "not having a spec" not in str(w.message)] == []


def test_sync_vector_env_over_the_view() -> None:
    vector = gymnasium.vector.SyncVectorEnv(
        [lambda: gymnasium.make(GYMNASIUM_ID, env_fn=quiz_env, partners=PARTNERS)] * 3
    )
    obs, infos = vector.reset(seed=8)
    assert obs == (PROMPTS[8], PROMPTS[9], PROMPTS[0])
    assert infos["item_index"].tolist() == [8, 9, 0]
    # the partner's answer is longer than "a" but not than the third agent_0 answer
    _, rewards, terms, truncs, _ = vector.step(("a", "é", "x" * 40))
    assert rewards.tolist() == [1.0, 1.0, 0.0] and terms.all() and not truncs.any()
    obs, *_ = vector.step(("a", "b", "c"))  # next-step auto-reset onto the next items
    assert obs == (PROMPTS[9], PROMPTS[0], PROMPTS[1])


def test_the_view_plays_the_partners_and_reports_the_agents_side(feedback_env) -> None:
    seen: list[str] = []

    def partner(prompt: str) -> str:
        seen.append(prompt)
        return "Clouds, rain and sun."

    view = as_gymnasium(feedback_env(), agent="agent_0", partners={"agent_1": partner})
    obs, info = view.reset(seed=1)
    assert obs == feedback_dataset()[1]["prompt"] and info["item_index"] == 1
    obs, reward, terminated, truncated, info = view.step("Clouds.")
    assert seen == [feedback_dataset()[1]["prompt"]]
    assert reward == 1.0 and (terminated, truncated) == (False, False)  # 21 / 7 chars: in [2, 3]
    assert "Your last answer had 7 characters" in obs and info["turn"] == 1
    _, _, terminated, truncated, _ = view.step("Clouds.")
    assert (terminated, truncated) == (True, False)
    assert "Your last answer had 21 characters" in seen[1]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"agent": "agent_7"},
            ValueError,
            r"agent must be one of \['agent_0', 'agent_1'\], got 'agent_7'",
        ),
        (
            {"partners": {}},
            ValueError,
            r"partners must map every other agent \['agent_1'\] to a callable",
        ),
        ({"partners": {"agent_1": "hi"}}, TypeError, r"partners\['agent_1'\] must be a callable"),
    ],
)
def test_the_view_refuses_bad_arguments(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        as_gymnasium(quiz_env(), **{"partners": PARTNERS, **kwargs})


def test_a_partner_that_returns_no_str_is_named() -> None:
    view = as_gymnasium(quiz_env(), partners={"agent_1": lambda prompt: 42})
    view.reset(seed=0)
    with pytest.raises(TypeError, match=r"partners\['agent_1'\] must return a completion str"):
        view.step("a")


def test_make_needs_an_env_factory() -> None:
    with pytest.raises(TypeError, match=r"env_fn must be a function that builds a fresh CoMLRLEnv"):
        make_gymnasium_env(quiz_env(), partners=PARTNERS)


# -- TorchRL --------------------------------------------------------------------------------------
def test_torchrl_pettingzoo_wrapper_builds_specs_and_resets_with_dict_observations() -> None:
    torch = pytest.importorskip("torch")
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    team = PettingZooWrapper(quiz_env(dict_observations=True))
    td = team.reset(seed=3)
    assert list(td["agent", "observation", "prompt"]) == [PROMPTS[3]] * 2
    for key in ("turn", "item_index", "raw_reward"):
        assert team.observation_spec["agent", "info", key].dtype == torch.float32
    assert td["agent", "info", "item_index"].tolist() == [3.0, 3.0]
    # TorchRL 0.14.1 cannot hand text actions to a ParallelEnv (its action extraction takes only
    # NumPy arrays and dicts); docs/env.md says so. This pins the limitation we document.
    from tensordict import NonTensorStack

    td["agent", "action"] = NonTensorStack("a", "bb")
    with pytest.raises(NotImplementedError, match=r"Invalid type of data NonTensorStack"):
        team.step(td)


def test_torchrl_gym_wrapper_steps_the_single_agent_view() -> None:
    pytest.importorskip("torch")
    from torchrl.envs import GymWrapper

    single = GymWrapper(as_gymnasium(quiz_env(dict_observations=True), partners=PARTNERS))
    td = single.reset(seed=4)
    assert td["prompt"] == PROMPTS[4]
    td["action"] = "a"
    td = single.step(td)
    assert td["next", "reward"].item() == 1.0
    assert td["next", "terminated"].item() and not td["next", "truncated"].item()


def test_torchrl_serial_env_copies_play_different_items() -> None:
    pytest.importorskip("torch")
    from tensordict import NonTensorStack
    from torchrl.envs import GymWrapper, SerialEnv

    def make() -> GymWrapper:
        return GymWrapper(as_gymnasium(quiz_env(dict_observations=True), partners=PARTNERS))

    copies = SerialEnv(3, make)
    copies.set_seed(10)  # TorchRL derives a different seed for each copy
    rollout = copies.rollout(
        4,
        policy=lambda td: td.set("action", NonTensorStack("a", "b", "c")),
        break_when_any_done=False,
    )
    played = [list(row) for row in rollout["prompt"]]  # [copy][step]
    for step in zip(*played, strict=True):
        assert len(set(step)) == 3, step
    copies.close()
