"""The ``cmlrl`` command on tiny models: train, eval, check, plot, overrides and clean errors."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest

from cmlrl_agents.cli.commands import main
from cmlrl_agents.cli.tasks import CLIError, apply_overrides, parse_value

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "configs" / "tiny.yaml"
DOC = ROOT / "docs" / "experiments.md"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

USER_TASK = textwrap.dedent("""
    from datasets import Dataset

    def make_dataset(n=4):
        return Dataset.from_dict({"prompt": [f"Name {i} colours." for i in range(n)]})

    def brief(item):
        return "Briefly: " + item["prompt"]

    def detailed(item):
        return "In detail: " + item["prompt"]

    def quarter(short, long):
        return [0.25 for _ in short]

    def broken_reward(short, long):
        return [len(b) / len(a) for a, b in zip(short, long)]

    USER_TASK_CONSTANT = 1

    def task():
        return {"dataset": make_dataset, "formatters": [brief, detailed], "reward": quarter}
""")


def run_cli(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One `cmlrl train` of the tiny config (4 items, G=2, save_steps=2, limit 1)."""
    run = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", str(TINY), "--set", f"config.output_dir={run}"]) == 0
    return run


@pytest.fixture
def user_task(tmp_path, monkeypatch) -> Path:
    """A user's task module in tmp_path, importable as `cli_user_task` from there."""
    (tmp_path / "cli_user_task.py").write_text(USER_TASK)
    monkeypatch.delitem(sys.modules, "cli_user_task", raising=False)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("cli_user_task", None)


# -- train -------------------------------------------------------------------------------------


def test_train_on_the_tiny_config_writes_a_complete_run_folder(trained):
    for name in ("config.json", "metrics.csv", "metrics.jsonl", "eval-metrics.json"):
        assert (trained / name).is_file(), name
    assert (trained / "rewards.png").read_bytes()[:8] == PNG_MAGIC
    final = json.loads((trained / "eval-metrics.json").read_text())
    assert final["env_step"] == 8  # 4 items x 2 aligned joint actions
    assert 0.0 <= final["eval/turn_1/reward_mean"] <= 1.0
    rows = read_jsonl(trained / "metrics.jsonl")
    assert [r["env_step"] for r in rows if "turn_1/reward_mean" in r] == [4, 8]
    assert [p.name for p in (trained / "checkpoints").iterdir()] == ["checkpoint-4"]
    for i in (0, 1):
        assert (trained / "model" / f"agent_{i}" / "config.json").is_file()
    assert json.loads((trained / "config.json").read_text())["algorithm"] == "magrpo"


def test_set_overrides_reach_the_trainer_config(tmp_path, capsys):
    run = tmp_path / "run"
    code, out, err = run_cli(
        capsys,
        *("train", TINY, "--no-save-model"),
        *("--set", f"config.output_dir={run}", "--set", "config.agent_learning_rate=2e-3"),
        *("--set", "config.max_new_tokens=3", "--set", "task.max_train_items=2"),
        *("--set", "config.save_steps=0"),
    )
    assert code == 0, err
    assert f"run folder: {run}" in out and "reward plot:" in out
    config = json.loads((run / "config.json").read_text())
    assert config["agent_learning_rate"] == 0.002 and config["max_new_tokens"] == 3
    assert read_jsonl(run / "metrics.jsonl")[-1]["env_step"] == 4  # 2 items x 2
    assert not (run / "model").exists() and not (run / "checkpoints").exists()


def test_set_values_are_yaml_scalars_and_reshape_string_sections():
    spec = {"model": "tiny", "config": {"seed": 0}}
    out = apply_overrides(
        spec,
        [
            "config.agent_learning_rate=1e-5",
            "model.device=cpu",
            "wandb.config_sections.output.verbose=false",
            "wandb.tags=[a, b]",
        ],
    )
    assert out["config"] == {"seed": 0, "agent_learning_rate": 1e-5}
    assert out["model"] == {"name_or_path": "tiny", "device": "cpu"}
    assert out["wandb"] == {"config_sections": {"output": {"verbose": False}}, "tags": ["a", "b"]}
    assert spec == {"model": "tiny", "config": {"seed": 0}}  # the input is not changed
    assert parse_value("2.5E+3") == 2500.0 and parse_value("null") is None
    with pytest.raises(CLIError, match="section.key=value"):
        apply_overrides(spec, ["config.seed"])


def test_the_installed_console_script_trains_and_fails_cleanly(tmp_path):
    script = Path(sys.executable).parent / "cmlrl"
    script = str(script) if script.exists() else shutil.which("cmlrl")
    if script is None:
        pytest.skip("the cmlrl console script is not installed (pip install -e .)")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    args = [script, "train", str(TINY), "--no-save-model", "--set", "task.max_train_items=2"]
    done = subprocess.run(
        [*args, "--set", "config.output_dir=run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "run folder: run" in done.stdout
    assert (tmp_path / "run" / "eval-metrics.json").is_file()
    bad = subprocess.run(
        [*args, "--set", "config.top_p=2"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "cmlrl train: error: config: top_p must be <= 1.0, got 2.\n"


# -- user errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("modle.name_or_path=tiny", ["'modle'", "did you mean 'model'", "algorithm, model, task"]),
        ("config.agent_learnin_rate=1", ["'agent_learnin_rate'", "num_generations, joint_mode"]),
        ("algorithm=grpo", ["'grpo'", "magrpo, mareinforce, maremax, marloo, iac, maac"]),
        ("task.name=length", ["'length'", "length_ratio, length_feedback"]),
        ("task.rewrd=m:f", ["unknown task key 'rewrd'", "did you mean 'reward'", "formatters"]),
        ("model.dtyp=float32", ["'dtyp'", "name_or_path, critic_name_or_path, dtype"]),
        ("model=[1]", ["model must be a name or a mapping"]),
        ("model.device=gpu", ["model.device='gpu' is not a device", "'cuda:N'"]),
        (
            "model={name_or_path: smollm2, dtype: bf16}",
            ["model.dtype='bf16' is not one of", "'bfloat16'"],
        ),
        ("model=tiniy", ["'tiniy' is no built-in model (did you mean 'tiny'?)"]),
        ("model.dtype=bfloat16", ["model.dtype is not used by the built-in tiny model"]),
        ("algorithm.name=iac", ["unknown algorithm {'name': 'iac'}", "magrpo, mareinforce"]),
        ("wandb.projct=p", ["'projct'", "project, entity, name, run_name, tags, dir"]),
        ("config.top_p=2", ["config: top_p must be <= 1.0, got 2."]),
        ("config.max_new_tokens=many", ["max_new_tokens must be an int, got 'many'"]),
        ("task.reward=cli_no_such_module:f", ["module 'cli_no_such_module' not found"]),
        ("task.reward=cmlrl_env.tasks:nope", ["has no attribute 'nope'", "length_ratio_reward"]),
        ("task.reward_processor.scal=2", ["'scal'", "scale, shift, clip"]),
        ("model.critic_name_or_path=tiny", ["critic_name_or_path is not used by algorithm"]),
        (
            "task.metrics_callback=cmlrl_env.tasks:length_feedback",
            ["task.metrics_callback is not used by algorithm 'magrpo'", "eval_logger"],
        ),
    ],
)
def test_unknown_or_bad_values_exit_2_with_one_line_naming_the_choices(capsys, override, expected):
    code, out, err = run_cli(capsys, "train", TINY, "--set", override)
    assert code == 2 and out == ""
    assert err.startswith("cmlrl train: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in expected:
        assert fragment in err


def test_run_file_problems_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: magrpo\nmodel: tiny\ntask: length_ratio\ntrainer: {}\n")
    code, _, err = run_cli(capsys, "train", bad)
    assert code == 2 and "unknown section of bad.yaml 'trainer'" in err
    assert "valid: algorithm, model, task, config, peft, wandb" in err
    code, _, err = run_cli(capsys, "train", tmp_path / "missing.yaml")
    assert code == 2 and "not found" in err
    (tmp_path / "list.yaml").write_text("- 1\n")
    assert run_cli(capsys, "eval", tmp_path / "list.yaml")[0] == 2
    assert run_cli(capsys, "train")[0] == 2  # argparse: the run file is missing


# -- user tasks and check ------------------------------------------------------------------------


def test_a_user_task_given_as_module_function_trains(user_task, capsys):
    (user_task / "run.yaml").write_text(
        textwrap.dedent("""
        model: tiny
        task:
          dataset: cli_user_task:make_dataset
          dataset_kwargs: {n: 4}
          test_size: 0.5
          formatters: [cli_user_task:brief, cli_user_task:detailed]
          reward: cli_user_task:quarter
          reward_processor: {scale: 2.0}
        config: {num_generations: 2, max_new_tokens: 3, eval_interval: 0, eval_num_samples: 2,
                 verbose: false, output_dir: out}
        """)
    )
    code, out, err = run_cli(capsys, "train", user_task / "run.yaml", "--no-save-model")
    assert code == 0, err
    rows = read_jsonl(user_task / "out" / "metrics.jsonl")
    # the user's reward (0.25) went through the configured processor (x2)
    assert {r["turn_1/reward_mean"] for r in rows if "turn_1/reward_mean" in r} == {0.5}
    final = json.loads((user_task / "out" / "eval-metrics.json").read_text())
    assert final["eval/turn_1/reward_mean"] == 0.5


def test_check_passes_on_a_good_task(user_task, capsys):
    code, out, _ = run_cli(capsys, "check", "--task", "length_ratio")
    assert code == 0 and out.splitlines()[-1] == "OK: the task passes every check."
    assert "check_task: 0 problem(s)" in out and "check_env: 7 checks passed" in out
    code, out, _ = run_cli(
        capsys,
        *("check", "--dataset", "cli_user_task:make_dataset", "--reward", "cli_user_task:quarter"),
        *("--formatters", "cli_user_task:brief", "cli_user_task.py:detailed"),
    )
    assert code == 0, out
    assert "gave 0.25 to every sample joint response" in out  # a constant reward is flagged


def test_a_task_factory_given_as_module_function(user_task, capsys):
    code, out, _ = run_cli(capsys, "check", "--task", "cli_user_task:task")
    assert code == 0 and "reward_func quarter gave 0.25" in out
    code, out, _ = run_cli(
        capsys, "check", "--task", "cli_user_task:task", "--reward", "cli_user_task:broken_reward"
    )
    assert code == 1 and "ZeroDivisionError" in out
    code, _, err = run_cli(capsys, "check", "--task", "cli_user_task:brief")
    assert code == 2 and "task 'cli_user_task:brief'() failed: brief() missing" in err
    code, _, err = run_cli(capsys, "check", "--task", "cli_user_task:USER_TASK_CONSTANT")
    assert code == 2 and "must be a function without arguments that returns a mapping" in err


def test_check_fails_readably_on_a_broken_reward(user_task, capsys):
    (user_task / "run.yaml").write_text(
        "task: {dataset: cli_user_task:make_dataset, reward: cli_user_task:broken_reward}\n"
    )
    code, out, err = run_cli(capsys, "check", user_task / "run.yaml")
    assert code == 1 and "Traceback" not in out + err
    assert "ZeroDivisionError: division by zero" in out and "broken_reward" in out
    assert out.splitlines()[-1].startswith("FAILED: check_task found 3 problem(s)")


# -- plot and eval -------------------------------------------------------------------------------


def test_plot_writes_a_png(trained, tmp_path, capsys):
    output = tmp_path / "plot.png"
    code, out, _ = run_cli(capsys, "plot", trained, "--output", output)
    assert code == 0 and out.strip() == str(output)
    assert output.read_bytes()[:8] == PNG_MAGIC
    code, _, err = run_cli(capsys, "plot", tmp_path / "empty")
    assert code == 2 and "no metrics.jsonl" in err


def test_eval_from_a_checkpoint_repeats_the_final_evaluation(trained, capsys, tmp_path):
    # The last checkpoint holds the weights and the run's sampling seed (its eval key).
    final = json.loads((trained / "eval-metrics.json").read_text())
    final.pop("env_step")
    code, out, err = run_cli(
        capsys, "eval", TINY, "--set", f"config.output_dir={trained}", "--checkpoint", "latest"
    )
    assert code == 0, err
    assert json.loads(out[: out.rindex("}") + 1]) == final
    assert json.loads((trained / "eval" / "eval-metrics.json").read_text())["env_step"] == 8
    code, _, err = run_cli(
        capsys,
        *("eval", TINY, "--set", "algorithm=marloo", "--output-dir", tmp_path / "ev"),
        *("--checkpoint", trained / "checkpoints" / "checkpoint-4"),
    )
    assert code == 2 and "written by the magrpo trainer, not marloo" in err


def test_eval_of_the_best_model(tmp_path, capsys):
    run = tmp_path / "run"
    best = (
        "--set",
        "config.save_best_by=eval/turn_1/reward_mean",
        "--set",
        "config.eval_interval=2",
    )
    assert run_cli(capsys, "train", TINY, "--set", f"config.output_dir={run}", *best)[0] == 0
    (folder,) = (run / "best").iterdir()
    state = json.loads((folder / "trainer_state.json").read_text())["trainer_state"]
    code, out, err = run_cli(
        capsys, "eval", TINY, "--set", f"config.output_dir={run}", "--checkpoint", "best"
    )
    assert code == 0, err
    assert (
        json.loads((run / "eval" / "eval-metrics.json").read_text())["env_step"]
        == (state["env_step"])
    )
    code, _, err = run_cli(
        capsys,
        "eval",
        TINY,
        "--set",
        f"config.output_dir={tmp_path / 'none'}",
        "--checkpoint",
        "best",
    )
    assert code == 2 and "holds no best model" in err


def test_eval_of_a_saved_model_folder(trained, tmp_path, capsys):
    code, out, err = run_cli(
        capsys,
        *("eval", TINY, "--checkpoint", trained / "model", "--num-eval-samples", 1),
        *("--output-dir", tmp_path / "ev"),
    )
    assert code == 0, err
    metrics = json.loads((tmp_path / "ev" / "eval-metrics.json").read_text())
    assert set(metrics) == {"env_step", "eval/turn_1/reward_mean", "eval/turn_1/expected_return"}
    code, _, err = run_cli(capsys, "eval", TINY, "--checkpoint", tmp_path)
    assert code == 2 and "neither a checkpoint folder" in err
    loads = mock.patch("cmlrl_agents.cli.plan.build_trainer", side_effect=AssertionError("built"))
    with loads:  # refused before any model loads
        code, _, err = run_cli(capsys, "eval", TINY, "--num-eval-samples", 0)
    assert code == 2 and "--num-eval-samples must be >= 1, got 0" in err


def test_a_saved_model_folder_evaluates_with_its_runs_seed(tmp_path, capsys):
    # Trained with another seed than the run file's: the saved agents are evaluated with the
    # run's own (config.json's sample_seed), so the evaluation repeats the run's final one.
    run = tmp_path / "run"
    seeded = ("--set", f"config.output_dir={run}", "--set", "config.seed=7")
    code, out, err = run_cli(capsys, "train", TINY, *seeded)
    assert code == 0, err
    final = json.loads((run / "eval-metrics.json").read_text())
    code, out, err = run_cli(
        capsys,
        *("eval", TINY, "--checkpoint", run / "model", "--output-dir", tmp_path / "ev"),
        *("--set", f"config.output_dir={run}"),
    )
    assert code == 0, err
    again = json.loads((tmp_path / "ev" / "eval-metrics.json").read_text())
    assert again["eval/turn_1/reward_mean"] == final["eval/turn_1/reward_mean"]


@pytest.mark.parametrize("algorithm", ["iac", "maac"])
def test_actor_critic_trainers_run_from_the_command_line(algorithm, tmp_path, capsys):
    pytest.importorskip("cmlrl_agents.algorithms.actor_critic")
    code, out, err = run_cli(
        capsys,
        *("train", TINY, "--no-save-model", "--set", f"algorithm={algorithm}"),
        *("--set", "task.max_train_items=2", "--set", f"config.output_dir={tmp_path / 'run'}"),
    )
    assert code == 0, err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["algorithm"] == algorithm
    assert "eval/turn_1/reward_mean" in out


def test_the_documented_tiny_example_runs_as_written(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"^```bash\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)
    block = next(b for b in blocks if "examples/configs/tiny.yaml" in b)
    (tmp_path / "examples" / "configs").mkdir(parents=True)
    shutil.copy(TINY, tmp_path / "examples" / "configs" / "tiny.yaml")
    monkeypatch.chdir(tmp_path)
    for line in block.splitlines():
        command = shlex.split(line, comments=True)
        assert command[0] == "cmlrl", line
        code, _, err = run_cli(capsys, *command[1:])
        assert code == 0, f"{line}\n{err}"
    runs = tmp_path / "runs"
    assert (runs / "tiny" / "rewards.png").is_file() and (runs / "tiny" / "eval").is_dir()
    assert json.loads((runs / "tiny-lr" / "config.json").read_text())["agent_learning_rate"] == 5e-4
