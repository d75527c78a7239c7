"""``cmlrl experiment``: the tiny-model version of the paper experiment end to end, resuming,
equal compute, the per-sample eval summary and the file's checks."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from cmlrl_agents.cli.commands import main
from cmlrl_agents.cli.experiment import load_experiment
from cmlrl_agents.cli.experiment_eval import CountingBackend, summarize
from cmlrl_agents.cli.experiment_report import summary_rows
from cmlrl_agents.cli.experiment_runs import run_files
from cmlrl_agents.cli.spec import CLIError

PAPER = Path(__file__).resolve().parents[2] / "examples" / "experiments" / "paper_small.yaml"
TINY = (
    *("model=tiny", "seeds=[0,1]", "compute.train_items=2", "compute.items_per_round=2"),
    *("compute.num_generations=2", "compute.max_new_tokens=8", "eval.max_items=2"),
    *("eval.samples_per_item=2", "eval.pass_k=2", "eval.every_rounds=1"),
    *("tasks.writing.compute.max_new_tokens=8", "tasks.writing.compute.train_items=2"),
    *("tasks.writing.eval.max_items=2", "tasks.writing.seeds=[0,1]"),
    *("tasks.code_2turn.compute.train_items=2", "tasks.code_2turn.compute.num_generations=2"),
    *("tasks.code_2turn.eval.samples_per_item=2", "tasks.code_2turn.eval.pass_k=2"),
)


def tiny_argv(out: Path, *extra: str) -> list[str]:
    sets = [arg for pair in TINY + extra for arg in ("--set", pair)]
    return ["experiment", str(PAPER), "--output-dir", str(out), *sets]


def test_the_tiny_experiment_runs_every_method_and_writes_the_table_and_plot(
    tmp_path, capsys
) -> None:
    out = tmp_path / "exp"
    assert main(tiny_argv(out)) == 0
    printed = capsys.readouterr().out
    assert printed.count(": eval reward ") == 14  # 3 + 3 + 1 methods, 2 seeds each
    for suffix in ("md", "csv", "json", "png"):
        assert (out / f"results.{suffix}").stat().st_size > 0
    report = json.loads((out / "results.json").read_text())
    assert report["overrides"][0] == "model=tiny" and len(report["library"]["commit"]) == 40
    rows = {(r["task"], r["method"]): r for r in report["rows"]}
    assert set(rows) == {
        *((t, m) for t in ("code", "writing") for m in ("untrained team", *METHODS)),
        *(("code_2turn", m) for m in ("untrained team", "team")),
    }
    assert all(r["seeds"] == 2 and r["eval_samples"] == 4 for r in rows.values())
    assert rows["code", "team"]["pass@k"].startswith("pass@2: ")
    assert rows["code", "centralized"]["parse_rate"] != ""
    assert " → " in rows["writing", "single"]["parse_rate"]  # the split rate, from the texts
    assert rows["code", "team"]["token_budget"] == "64" and rows["code", "team"]["run_change_se"]
    measures = {(m["task"], m["method"], m["measure"]): m for m in report["measures"]}
    assert measures["writing", "team", "content/summary_in_passage"]["trained_on"] == "no"
    assert measures["code", "single", "level/tests"]["trained_on"] == "yes"
    assert ("code", "team", "pass@1") in measures
    assert rows["code_2turn", "team"]["turn_2"] != "" and "turn_2" not in rows["code", "team"]
    runs = report["runs"]
    assert len(runs) == 14
    for run in runs:
        assert [p["rounds"] for p in run["points"]] == [0, 1]  # before, then after one round
        assert run["optimizer_steps"] == 1 and run["rounds"] == 1
    # Equal compute: every 1-turn method samples the same budget (2 items x G=2 x 2 x 8 tokens).
    one_turn = [r for r in runs if r["num_turns"] == 1]
    assert {r["token_budget_per_round_turn_1"] for r in one_turn} == {64}
    assert all(0 < r["train_tokens"] <= 64 for r in one_turn)
    two_turn = [r for r in runs if r["num_turns"] == 2]
    assert all(64 < r["train_tokens"] <= 64 + 2 * 2 * 2 * 2 * 8 for r in two_turn)
    # Run again: every run is finished, so each is skipped and the table is written again.
    (out / "results.md").unlink()
    assert main(tiny_argv(out)) == 0
    assert capsys.readouterr().out.count("finished before, skipped") == 14
    assert (out / "results.md").is_file()


METHODS = ("team", "single", "centralized")


def test_an_interrupted_run_starts_again_and_finished_runs_are_kept(tmp_path, capsys) -> None:
    out = tmp_path / "exp"
    only_code = ("seeds=[0]", "tasks={code: {kind: code, methods: [team, single]}}")
    assert main(tiny_argv(out, *only_code)) == 0
    capsys.readouterr()
    done = out / "code" / "team" / "seed-0"
    half = out / "code" / "single" / "seed-0"
    kept = (done / "result.json").read_text()
    (half / "result.json").unlink()  # as if stopped before the end
    (half / "leftover.txt").write_text("from the interrupted run")
    assert main(tiny_argv(out, *only_code)) == 0
    printed = capsys.readouterr().out
    assert "code/team/seed-0: finished before, skipped" in printed
    assert "code/single/seed-0: eval reward" in printed
    assert (done / "result.json").read_text() == kept
    assert (half / "result.json").is_file() and not (half / "leftover.txt").exists()
    # A finished run is reused only under the same settings: another rate is refused by name.
    result = json.loads((done / "result.json").read_text())
    assert len(result["key"]) == 64 and set(result["library"]) == {"commit", "uncommitted_changes"}
    other = (*only_code, "config.agent_learning_rate=3e-5")
    assert main(tiny_argv(out, *other)) == 2
    assert (
        "code/team/seed-0 finished before with other settings "
        "(run.config.agent_learning_rate: 2e-05 then, 3e-05 now)"
    ) in capsys.readouterr().err


def test_equal_compute_is_derived_from_one_section() -> None:
    plan = load_experiment(PAPER)
    runs = {(r.task, r.method, r.seed): r.spec for r in run_files(plan)}
    assert len(runs) == 7 * 3 + 3  # writing has a fourth seed
    team, single, central = (runs["code", m, 0] for m in METHODS)
    assert team["config"]["max_new_tokens"] == 96 and team["config"]["num_agents"] == 2
    assert single["config"]["max_new_tokens"] == central["config"]["max_new_tokens"] == 192
    assert central["algorithm"] == "magrpo_centralized"
    assert central["config"]["parse_failure_reward"] == 0.0
    for key in ("num_generations", "rollout_buffer_size", "num_train_epochs", "seed"):
        assert team["config"][key] == single["config"][key] == central["config"][key]
    assert runs["writing", "team", 1]["config"]["max_new_tokens"] == 80
    assert runs["writing", "single", 1]["task"]["reward"].endswith(":writing_single_reward")
    two = runs["code_2turn", "team", 2]
    assert (two["config"]["num_turns"], two["config"]["num_generations"]) == (2, 2)
    assert "transition" not in two["task"] and team["task"]["transition"] is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("tasks.code.compute.train_items=5", "not a multiple of items_per_round=2"),
        ("tasks.code.eval.pass_k=3", "pass@k needs n >= k"),
        ("eval.every_rounds=3", "does not divide its 8 rounds"),
        ("tasks.code.methods=[team, solo]", "methods must list some of"),
        ("tasks.writing.num_turns=2", "more than one turn is the code task's team only"),
        ("seeds=[]", "seeds must be a non-empty list"),
        ("seeds=[0, 0, 1]", "seeds must be a non-empty list of distinct ints"),  # counted twice
        ("tasks.code.methods=[team, team]", "methods must list some of .*, each once"),
        ("config.seed=3", "config.seed of task code is set by the runner from seeds"),
        ("config.max_new_tokens=9", "from compute.max_new_tokens; set that instead"),
        ("config.save_steps=4", "config.save_steps of task code is fixed by the runner"),
        ("tasks.code_2turn.baseline=nothing", "baseline 'nothing' is not a task here"),
        ("computes.epochs=1", "unknown key of paper_small.yaml 'computes'"),
        (
            "compute.max_new_tokens=8",
            "does not reach task writing, whose own compute.max_new_tokens is 80",
        ),
    ],
)
def test_mistakes_in_the_file_are_one_clear_error(override: str, message: str) -> None:
    with pytest.raises(CLIError, match=message.replace("(", r"\(")):
        load_experiment(PAPER, [override])


def test_a_model_name_takes_its_fields_from_overrides() -> None:
    plan = load_experiment(PAPER, ["model=tiny", "model.device=cpu"])
    assert plan.model == {"name_or_path": "tiny", "device": "cpu"}


def test_only_selects_a_task_a_method_or_a_run_by_whole_names(tmp_path, capsys) -> None:
    # `--only code` is the code task, not code_2turn; `seed-1` would not be `seed-10`.
    from cmlrl_agents.cli.experiment import _selects

    assert _selects("code", "code/team/seed-0") and not _selects("code", "code_2turn/team/seed-0")
    assert _selects("code/team/", "code/team/seed-1")
    assert not _selects("code/team/seed-1", "code/team/seed-10")


def test_a_mistake_in_a_later_task_stops_the_command_before_any_run_trains(
    tmp_path, capsys
) -> None:
    out = tmp_path / "exp"
    assert main(tiny_argv(out, "tasks.code_2turn.config.temperatur=0.5")) == 2
    assert "no field 'temperatur'" in capsys.readouterr().err
    assert not out.exists() or not any(out.rglob("result.json"))


def test_cmlrl_train_refuses_to_train_in_a_finished_experiment_run(tmp_path, capsys) -> None:
    out = tmp_path / "exp"
    only_code = ("seeds=[0]", "tasks={code: {kind: code, methods: [team]}}")
    assert main(tiny_argv(out, *only_code)) == 0
    folder = out / "code" / "team" / "seed-0"
    before = (folder / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", str(folder / "run.yaml")]) == 2
    assert "is a finished run of `cmlrl experiment`" in capsys.readouterr().err
    assert (folder / "metrics.jsonl").read_text() == before


def test_finished_runs_are_the_same_runs_read_from_a_copied_folder(tmp_path, capsys) -> None:
    import shutil

    only_code = ("seeds=[0]", "tasks={code: {kind: code, methods: [team]}}")
    assert main(tiny_argv(tmp_path / "exp", *only_code)) == 0
    shutil.copytree(tmp_path / "exp", tmp_path / "copy")
    capsys.readouterr()
    assert main(tiny_argv(tmp_path / "copy", *only_code)) == 0
    assert "code/team/seed-0: finished before, skipped" in capsys.readouterr().out


def test_summarize_by_a_hand_worked_example() -> None:
    # Two items, two samples each: rewards (1, 3) and (0, 0); item a passes once.
    samples = [
        {"item": "a", "reward": {"turn_1": 1.0}, "passed": {"turn_1": 0.0}},
        {"item": "a", "reward": {"turn_1": 3.0}, "passed": {"turn_1": 1.0}},
        {"item": "b", "reward": {"turn_1": 0.0}, "passed": {"turn_1": 0.0}},
        {"item": "b", "reward": {"turn_1": 0.0}, "passed": {"turn_1": 0.0}},
    ]
    point = summarize(samples, num_turns=1, pass_k=2)
    assert point["reward"] == 1.0 and point["samples"] == 4
    # Within-item variances 2 and 0: sqrt((2/2 + 0/2)) / 2 items = 0.5.
    assert point["reward_se"] == 0.5
    assert math.isclose(point["turn_1/reward_std"], math.sqrt(2.0))  # values 1,3,0,0
    assert point["turn_1/pass@1"] == 0.25 and point["turn_1/pass@2"] == 0.5
    parsed = [{**s, "parsed": i != 0} for i, s in enumerate(samples)]
    assert summarize(parsed, 1, 2)["parse_rate"] == 0.75
    single = summarize([{"item": "a", "reward": {"turn_1": 1.0}}] * 1, 1, 1)
    assert single["reward"] == 1.0 and math.isnan(single["reward_se"])


def test_the_table_by_a_hand_worked_example(tmp_path) -> None:
    # Two single-agent writing seeds; each eval point stores its answers in eval-samples.jsonl.
    def point(reward: float, se: float) -> dict:
        return {"samples": 2, "reward": reward, "reward_se": se, "turn_1/level/overlap": reward}

    one, two = tmp_path / "seed-0", tmp_path / "seed-1"
    results = {one: [point(1.0, 0.3), point(2.0, 0.4)], two: [point(0.0, 0.6), point(2.0, 0.8)]}
    texts = [["summary only", "a summary\n\nits expansion"], ["a\n\nb", "c\n\nd"]]
    runs = []
    for (folder, points), answers in zip(results.items(), (texts[0], texts[1]), strict=True):
        folder.mkdir()
        stored = {"num_turns": 1, "points": points, "rounds": 3}
        stored.update(token_budget_per_round_turn_1=10, train_tokens=20, optimizer_steps=3)
        stored.update(s_per_round=1, cpu_s_per_round=1, eval_s_per_pass=1, wall_s=9)
        (folder / "result.json").write_text(json.dumps(stored))
        samples = [{"completions": [[a]]} for a in answers]
        rows = [json.dumps({"samples": samples})] * 2
        (folder / "eval-samples.jsonl").write_text("\n".join(rows))
        run = SimpleNamespace(task="writing", method="single", folder=folder, finished=lambda: 1)
        run.result = lambda f=folder: json.loads((f / "result.json").read_text())
        runs.append(run)
    plan = SimpleNamespace(tasks={"writing": {"kind": "writing"}})
    report = summary_rows(plan, runs)
    (row,) = report["rows"]
    # Changes 1.0 and 2.0; each run's own SE of it: hypot(0.3, 0.4) = 0.5, hypot(0.6, 0.8) = 1.
    assert (row["before"], row["after"]) == ("0.500 ± 0.500", "2.000 ± 0.000")
    assert row["change"] == "1.500 ± 0.500" and row["run_change_se"] == "0.750"
    # Seed 0 splits one answer of two, seed 1 both: 0.75 before and after, SE 0.25 over seeds.
    assert row["parse_rate"] == "0.750 → 0.750 ± 0.250"
    assert row["token_budget"] == "30" and row["train_tokens"] == "20"
    (overlap,) = report["measures"]
    assert overlap["measure"] == "level/overlap" and overlap["change"] == "1.500 ± 0.500"
    assert report["notes"] == []
    for run in runs:  # no answer splits: the note says the method never parsed
        no_split = json.dumps({"samples": [{"completions": [["one paragraph"]]}]})
        (run.folder / "eval-samples.jsonl").write_text(f"{no_split}\n{no_split}")
    (note,) = summary_rows(plan, runs)["notes"]
    assert note.startswith("writing/single never parsed")


def test_the_counting_backend_counts_training_and_eval_tokens_apart() -> None:
    def completion(n: int) -> SimpleNamespace:
        return SimpleNamespace(completion_ids=tuple(range(n)))

    class Inner:
        synced = 0

        def generate(self, agents, requests):
            return [[[completion(3)] * r.num_samples for _ in r.prompts] for r in requests]

        def sync(self, agents):
            self.synced += 1

    ticks = []
    counter = CountingBackend(Inner(), on_train=ticks.append)
    counter.rounds_done = lambda: 5
    train = [SimpleNamespace(prompts=["p", "q"], num_samples=4)] * 2
    counter.generate([], train)
    counter.generate([], [SimpleNamespace(prompts=["p"], num_samples=1)])
    counter.sync([])
    assert (counter.train_tokens, counter.eval_tokens) == (2 * 2 * 4 * 3, 3)
    assert ticks == [5] and counter.inner.synced == 1 and counter.eval_started is not None


def test_the_counting_wrapper_is_the_backend_training_and_evaluation_read(tmp_path) -> None:
    from test_magrpo_trainer import make_trainer

    from cmlrl_agents.cli.experiment_runs import _count_generation

    trainer = make_trainer(tmp_path)
    backend = trainer.generation_backend
    counter = _count_generation(trainer, SimpleNamespace(tick=None, eval_tick=None))
    assert trainer.generation_backend is counter and trainer.evaluator.backend is counter
    assert counter.inner is backend


def test_the_pilot_benchmark_times_a_trained_and_an_untrained_run(
    tmp_path, monkeypatch, capsys
) -> None:
    import importlib.util
    import sys

    path = PAPER.parents[2] / "benchmarks" / "paper_pilot.py"
    spec = importlib.util.spec_from_file_location("paper_pilot", path)
    pilot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pilot)
    sets = ("model=tiny", "compute.max_new_tokens=8", "tasks.writing.compute.max_new_tokens=8")
    argv = ["paper_pilot.py", "--output-dir", str(tmp_path), "--only", "code/team"]
    argv += ["writing/centralized", "--eval-only", "writing/centralized"]
    monkeypatch.setattr(sys, "argv", [*argv, *(a for s in sets for a in ("--set", s))])
    pilot.main()
    table = capsys.readouterr().out.split("\n\n")[-1].strip().splitlines()
    assert table[0].startswith("| run | s per round (CPU s) | train tokens per round / budget |")
    team, central = table[2:]
    assert team.startswith("| code / team | ") and team.split(" | ")[2].endswith(" / 128")
    assert central.startswith("| writing / centralized | not trained | not trained | ")
    assert central.endswith(" | 16 |  | 0.000 |")  # 16 eval samples, no pass@1, parse rate 0


def test_modules_next_to_the_experiment_file_are_found(tmp_path, capsys) -> None:
    folder = tmp_path / "exp_files"
    folder.mkdir()
    (folder / "my_leads.py").write_text(
        "from cmlrl_env.writing_tasks import writing_news_splits\n"
        "def small():\n"
        "    train, evaluation = writing_news_splits()\n"
        "    return train.select(range(2)), evaluation.select(range(1))\n"
    )
    (folder / "e.yaml").write_text(
        "model: tiny\nseeds: [0]\n"
        "compute: {train_items: 2, epochs: 1, items_per_round: 2, num_generations: 2, "
        "max_new_tokens: 4}\neval: {max_items: 1}\n"
        "tasks:\n  writing: {kind: writing, dataset: my_leads:small, methods: [team]}\n"
    )
    out = tmp_path / "out"
    assert main(["experiment", str(folder / "e.yaml"), "--output-dir", str(out)]) == 0
    assert (out / "writing" / "team" / "seed-0" / "result.json").is_file()


def test_the_tables_header_names_each_tasks_own_seeds() -> None:
    from cmlrl_agents.cli.experiment_report import _seeds

    plan = load_experiment(PAPER)
    assert _seeds(plan) == "[0, 1, 2] (writing: [0, 1, 2, 3])"
    assert _seeds(load_experiment(PAPER, ["tasks.writing.seeds=[0, 1, 2]"])) == "[0, 1, 2]"
