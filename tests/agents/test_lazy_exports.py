"""``cmlrl_agents`` imports its public names on use; the tables the ``cmlrl`` command keeps to
check a run file without importing a trainer agree with the trainers themselves."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import cmlrl_agents
from cmlrl_agents.cli.plan import ALGORITHMS, CONFIGS, TRAINER_TAKES, config_class, trainer_class
from cmlrl_agents.cli.spec import CLIError
from cmlrl_agents.cli.tasks import TRAINER_CALLBACKS

INIT = Path(cmlrl_agents.__file__)


def test_every_public_name_is_imported_on_use_from_where_it_is_defined() -> None:
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    declared = [alias.name for node in block.body for alias in node.names]
    assert sorted(declared) == sorted(cmlrl_agents.__all__)
    for name in cmlrl_agents.__all__:
        module = next(n.module for n in block.body for a in n.names if a.name == name)
        assert getattr(cmlrl_agents, name) is getattr(importlib.import_module(module), name)
    assert set(cmlrl_agents.__all__) <= set(dir(cmlrl_agents))
    with pytest.raises(AttributeError, match="has no attribute 'MAGRPO'"):
        cmlrl_agents.MAGRPO  # noqa: B018


def test_the_config_table_names_each_trainers_config_class() -> None:
    assert list(CONFIGS) == list(ALGORITHMS) == list(TRAINER_TAKES)
    for name in ALGORITHMS:
        assert config_class(name) is trainer_class(name).config_class


def test_the_keyword_table_matches_each_trainers_signature() -> None:
    for name in ALGORITHMS:
        params = inspect.signature(trainer_class(name)).parameters
        takes = [k for k in (*TRAINER_CALLBACKS, "critic_model") if k in params]
        assert sorted(TRAINER_TAKES[name]) == sorted(takes), name


def test_an_unknown_algorithm_names_the_valid_ones() -> None:
    with pytest.raises(CLIError, match="unknown algorithm 'grpo'; valid: magrpo, mareinforce"):
        config_class("grpo")
