"""What the notebooks and guides tell a newcomer agrees with the code: the settings they call the
main job's, the learning rate they call the default, where the tiny models come from, and that
no guide needs the model hub."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from cmlrl_agents import MAGRPOConfig

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples" / "notebooks").glob("*.ipynb"))


def cells(path: Path, kind: str) -> list[str]:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == kind]


def main_job_defaults() -> dict[str, object]:
    """The argparse defaults of examples/length_ratio.py, read from its source."""
    tree = ast.parse((ROOT / "examples" / "length_ratio.py").read_text(encoding="utf-8"))
    defaults = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            keywords = {k.arg: k.value for k in node.keywords}
            if "default" in keywords and isinstance(keywords["default"], ast.Constant):
                defaults[node.args[0].value] = keywords["default"].value
    return defaults


def test_notebooks_take_the_tiny_models_from_where_the_examples_do() -> None:
    for path in NOTEBOOKS:
        code = "\n".join(cells(path, "code"))
        assert "cmlrl_agents.testing" not in code, path.name


def test_notebook_3_trains_smollm2_with_the_main_jobs_settings() -> None:
    (setup,) = [
        c
        for c in cells(ROOT / "examples/notebooks/03_train_a_team.ipynb", "code")
        if "SETTINGS" in c and "def models" in c
    ]
    scope: dict[str, object] = {"MODEL": "smollm2"}
    exec(compile(setup, "03_train_a_team", "exec"), scope)
    settings = scope["SETTINGS"]
    assert isinstance(settings, dict)
    main_job = main_job_defaults()
    assert settings["num_train_epochs"] == main_job["--epochs"] == 6
    assert settings["max_new_tokens"] == main_job["--max-new-tokens"] == 48
    # the main job leaves these at the library's defaults, and so does the notebook
    chosen = {"agent_learning_rate", "temperature", "top_p", "top_k", "rollout_buffer_size"}
    assert not chosen & set(settings)


def test_a_learning_rate_called_the_default_is_the_default() -> None:
    default = MAGRPOConfig.agent_learning_rate
    said = []
    for path in NOTEBOOKS:
        text = "\n".join(cells(path, "markdown") + cells(path, "code"))
        assert "2e-5" not in text, path.name  # the old main job's rate
        said += re.findall(r"default learning rate \((\de-\d)\)", text)
        said += re.findall(r"the learning rate \((\de-\d)\)", text)
    assert said and all(float(rate) == default for rate in said)


def test_the_main_jobs_time_is_the_same_in_the_readme_and_notebook_3() -> None:
    readme = plain((ROOT / "README.md").read_text(encoding="utf-8"))
    notebook = plain(
        "\n".join(cells(ROOT / "examples/notebooks/03_train_a_team.ipynb", "markdown"))
    )
    minutes = r"about (\d+(?: to \d+)?) minutes"
    (in_readme,) = re.findall(r"The main job: [^.]*? in " + minutes, readme)
    (in_notebook,) = re.findall(r"trains in " + minutes, notebook)
    assert in_readme == in_notebook


def test_no_guide_loads_a_model_from_the_hub() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for name in re.findall(r"from_pretrained\(\s*\"([^\"]+)\"", text):
            # a run folder or a local path, never "owner/model" on the hub
            assert name.startswith(("runs/", "./", "/")), (page.name, name)


def test_the_model_is_said_to_be_a_dequantised_gguf_where_it_is_introduced() -> None:
    said = re.compile(r"4-bit GGUF \(Q4_1\).*?de-quantis\w+ to float32")
    for page in (ROOT / "README.md", ROOT / "docs" / "benchmarks.md"):
        assert said.search(plain(page.read_text(encoding="utf-8"))), page.name
    for path in NOTEBOOKS[1:]:  # the notebooks with a model switch
        assert said.search(plain("\n".join(cells(path, "code")))), path.name


def plain(text: str) -> str:
    """Text on one line, without Markdown emphasis or comment marks."""
    return " ".join(text.replace("**", "").replace("\n# ", "\n").split())
