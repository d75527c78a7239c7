"""PettingZoo's test utilities probe ``reset``'s signature with placeholder options; the env
ignores unknown options only in calls from that package (``PROBING_PACKAGE``), so the rule holds
for whatever value a later PettingZoo sends, and user code still gets an error."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pettingzoo.test
import pytest
from datasets import Dataset
from pettingzoo.test import api_test, parallel_api_test
from pettingzoo.utils.conversions import parallel_to_aec

from cmlrl_env import CoMLRLEnv
from cmlrl_env.env import PROBING_PACKAGE


def env(**options: Any) -> CoMLRLEnv:
    dataset = Dataset.from_dict({"prompt": ["p0", "p1", "p2"]})
    reward = lambda c1, c2: [0.0] * len(c1)  # noqa: E731
    return CoMLRLEnv(dataset, None, reward, max_completion_chars=64, **options)


def reset_from(module: str, target: Any, options: Any) -> Any:
    """``target.reset(seed=0, options=options)`` run by code whose module is ``module``."""
    scope: dict[str, Any] = {"__name__": module, "target": target, "options": options}
    exec(compile("result = target.reset(seed=0, options=options)", module, "exec"), scope)
    return scope["result"]


def probed_options() -> list[Any]:
    """Every literal ``options=`` value that PettingZoo's installed test utilities pass to a
    ``reset`` call (read from their source, so a new probe value is tested as soon as it ships)."""
    found = []
    for info in pkgutil.walk_packages(pettingzoo.test.__path__, "pettingzoo.test."):
        if "example_envs" in info.name:
            continue
        source = Path(importlib.import_module(info.name).__file__ or "").read_text("utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "reset":
                for keyword in node.keywords:
                    if keyword.arg == "options":
                        found.append(ast.literal_eval(keyword.value))
    return found


def test_the_probing_package_is_pettingzoos_test_utilities() -> None:
    assert PROBING_PACKAGE == pettingzoo.test.__name__
    assert parallel_api_test.__module__.startswith(PROBING_PACKAGE + ".")


def test_pettingzoo_probes_with_the_value_the_env_accepts_from_there() -> None:
    probes = probed_options()
    assert probes == [{"options": 1}, {"options": 1}]  # api_test and parallel_api_test today
    for options in probes:
        obs, _ = reset_from("pettingzoo.test.api_test", env(), options)
        assert obs["agent_0"] == "p0"
        with pytest.raises(ValueError, match=r"unknown reset option\(s\) \['options'\]"):
            env().reset(seed=0, options=options)  # the same value from user code


@pytest.mark.filterwarnings("ignore:.*(NumPy array|probably should be)")
def test_pettingzoos_api_tests_pass() -> None:
    parallel_api_test(env(), num_cycles=3)
    # the AEC test wants a dtype on each observation: see cmlrl_env.conformance
    api_test(parallel_to_aec(env(dict_observations=True)), num_cycles=3)


@pytest.mark.parametrize("options", [{"probe": True}, {"options": 2, "index": 1}, 7, "x"])
def test_another_probe_value_from_pettingzoo_is_ignored_too(options: Any) -> None:
    obs, _ = reset_from("pettingzoo.test.future_test", env(), options)
    assert obs["agent_0"] == "p0"
    # through a wrapper too: the probing frame is searched up the whole stack
    aec = parallel_to_aec(env())
    reset_from("pettingzoo.test.future_test", aec, options)
    assert aec.observe("agent_0") == "p0"


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"probe": True}, ValueError, r"unknown reset option\(s\) \['probe'\]"),
        (7, TypeError, "options must be None or a dict"),
        # a module whose name only starts like PettingZoo's test package is not it
        ({"options": 1}, ValueError, r"unknown reset option\(s\) \['options'\]"),
    ],
)
def test_the_same_options_from_other_code_raise(options: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        reset_from("pettingzoo.testing_tools", env(), options)


def test_known_options_still_act_in_a_probe_call() -> None:
    obs, _ = reset_from("pettingzoo.test.api_test", env(), {"index": 2})
    assert obs["agent_0"] == "p2"
