"""The picture of one round: a rollout tree drawn to PNG (matplotlib) and to a self-contained HTML.

Levels are turns, left to right; each box is a joint action with each agent's completion
snippet, the reward ``r``, the return ``R`` and each agent's advantage ``A``; a red border marks
a branch that ended early (its reward passed ``early_termination_threshold``). The HTML holds the
full prompts and completions and the exact numbers (``data-*`` attributes), for reading and for
tests. Both are drawn from a :class:`~cmlrl_agents.runs.tree_view.TreeView`.
"""

from __future__ import annotations

import html
import json
import warnings
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.runs.tree_view import TreeNode, TreeView, rollout_tree_view

__all__ = ["MAX_PNG_LEAVES", "draw_rollout_tree", "save_rollout_tree", "write_tree_html"]

MAX_PNG_LEAVES = 512
"""Beyond this many leaves the PNG would pass matplotlib's 65536-pixel limit; use the HTML."""

_LEGEND = (
    "a0 [n]: agent 0's completion, n characters    r: reward    "
    "R: return = r + discount × mean R of the children (an ended branch: its r again for "
    "each unplayed turn)    "
    "A: each agent's advantage over its G siblings    red border: the branch ended early"
)


def draw_rollout_tree(
    view: TreeView | RolloutTree,
    output: str | Path,
    *,
    html_output: str | Path | None | bool = True,
    snippet_chars: int = 28,
    dpi: int = 110,
) -> tuple[Path, Path | None]:
    """Draw ``view`` to the PNG ``output`` and (by default) the HTML beside it.

    A ``RolloutTree`` is drawn through ``rollout_tree_view(tree)`` (item 0, MAGRPO's default
    settings). ``html_output``: True writes ``output`` with the suffix ``.html``; a path writes
    there; False or None writes no HTML. Returns ``(png_path, html_path or None)``.
    """
    if isinstance(view, RolloutTree):
        view = rollout_tree_view(view)
    if not isinstance(view, TreeView):
        raise TypeError(
            f"view must be a TreeView (rollout_tree_view(tree, ...)) or a RolloutTree, got "
            f"{type(view).__name__}."
        )
    if isinstance(snippet_chars, bool) or not isinstance(snippet_chars, int) or snippet_chars < 4:
        raise ValueError(f"snippet_chars must be an int >= 4, got {snippet_chars!r}.")
    rows = _leaf_rows(view)
    leaves = view.num_leaves
    if leaves > MAX_PNG_LEAVES:
        raise ValueError(
            f"the tree has {leaves} leaves, more than MAX_PNG_LEAVES={MAX_PNG_LEAVES} fit in a "
            "PNG; read the HTML (write_tree_html) or draw a smaller tree (fewer generations, "
            "aligned joint mode)."
        )
    png = Path(output)
    png.parent.mkdir(parents=True, exist_ok=True)
    _draw_png(view, rows, max(leaves, 1), png, snippet_chars, dpi)
    if html_output is True:
        html_path: Path | None = write_tree_html(view, png.with_suffix(".html"))
    elif html_output:
        html_path = write_tree_html(view, html_output)
    else:
        html_path = None
    return png, html_path


def save_rollout_tree(view: TreeView, stem: str | Path) -> dict[str, Path]:
    """Write ``stem.json`` (the view), ``stem.html`` and, unless the tree has more than
    ``MAX_PNG_LEAVES`` leaves, ``stem.png``; returns the paths by suffix."""
    stem = Path(stem)
    paths = {"json": view.save(stem.with_suffix(".json"))}
    if view.num_leaves <= MAX_PNG_LEAVES:
        paths["png"], _ = draw_rollout_tree(view, stem.with_suffix(".png"), html_output=False)
    paths["html"] = write_tree_html(view, stem.with_suffix(".html"))
    return paths


def _leaf_rows(view: TreeView) -> dict[int | None, float]:
    """Vertical position of each node (None: the root): leaves one row each in depth-first
    order, a parent at the mean of its children."""
    rows: dict[int | None, float] = {}
    next_row = 0

    def place(node_id: int | None) -> float:
        nonlocal next_row
        children = view.children(node_id)
        if not children:
            rows[node_id] = float(next_row)
            next_row += 1
        else:
            rows[node_id] = sum(place(c.id) for c in children) / len(children)
        return rows[node_id]

    place(None)
    return rows


def _snippet(text: str, chars: int) -> str:
    # Control characters have no glyph: a random model's bytes would print as warnings.
    flat = " ".join("".join(c if c.isprintable() else "·" for c in text).split())
    if not flat:
        return "(empty)"
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def _node_label(node: TreeNode, chars: int) -> str:
    lines = [
        f"a{a} [{len(text):>3}]: {_snippet(text, chars)}" for a, text in enumerate(node.completions)
    ]
    lines.append(f"r {node.reward:.3f}   R {node.turn_return:.3f}")
    lines.append("A " + "  ".join(f"{a:+.2f}" for a in node.advantages))
    if node.ended_early:
        lines.append("ended early")
    return "\n".join(lines)


def _draw_boxes(axes: Axes, view: TreeView, rows: dict[int | None, float], chars: int) -> None:
    """One box per node (coloured by reward, red border if ended early), joined to its parent."""
    rewards = [n.reward for n in view.nodes]
    low, high = min(rewards), max(rewards)
    cmap = colormaps["RdYlGn"]
    box = {"boxstyle": "round,pad=0.35", "linewidth": 1.0}
    style: dict[str, Any] = {
        "fontsize": 7.5,
        "family": "monospace",
        "va": "center",
        "ha": "left",
        "zorder": 3,
    }
    root_lines = [f"item {view.item_index}"] + [
        f"a{a}: {_snippet(p, chars)}" for a, p in enumerate(view.root_prompts)
    ]
    texts: dict[int | None, Text] = {
        None: axes.text(
            0.0,
            rows[None],
            "\n".join(root_lines),
            bbox={**box, "fc": "0.92", "ec": "0.4"},
            parse_math=False,
            **style,
        )
    }
    for node in view.nodes:
        shade = 0.5 if high == low else (node.reward - low) / (high - low)
        face = (*cmap(0.1 + 0.8 * shade)[:3], 0.45)
        edge = {"ec": "red", "linewidth": 2.2} if node.ended_early else {"ec": "0.35"}
        texts[node.id] = axes.text(
            node.turn,
            rows[node.id],
            _node_label(node, chars),
            bbox={**box, "fc": face, **edge},
            parse_math=False,
            **style,
        )
    for node in view.nodes:
        axes.annotate(
            "",
            xy=(0.0, 0.5),
            xycoords=texts[node.id],
            xytext=(1.0, 0.5),
            textcoords=texts[node.parent],
            arrowprops={"arrowstyle": "-", "color": "0.55", "linewidth": 0.8},
            zorder=1,
        )


def _draw_png(
    view: TreeView, rows: dict[int | None, float], leaves: int, path: Path, chars: int, dpi: int
) -> None:
    line_in = 0.15
    row_in = line_in * (view.num_agents + 3) + 0.12
    col_in = 0.1 * chars + 1.4
    height = leaves * row_in + 1.1  # inches: the rows, the title above, the legend below
    figure = Figure(figsize=((view.num_turns + 1) * col_in, height), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0.01, 0.35 / height, 0.98, (height - 0.8) / height))
    axes.set_xlim(-0.05, view.num_turns + 0.95)
    axes.set_ylim(leaves - 0.5, -1.0)
    axes.axis("off")
    _draw_boxes(axes, view, rows, chars)
    for turn in range(1, view.num_turns + 1):
        axes.text(turn, -0.85, f"turn {turn}", fontsize=9, weight="bold", ha="left")
    step = "" if view.env_step is None else f", env_step {view.env_step}"
    norm = _scale_words(view)
    figure.suptitle(
        f"Rollout tree of item {view.item_index}{step}: G = {view.num_generations}, "
        f"discount {view.discount:g}, advantage {view.advantage_mode} ({norm})",
        fontsize=10,
        y=1 - 0.1 / height,
        va="top",
    )
    parts = _LEGEND.split("    ")
    legend = "    ".join(parts[:3]) + "\n" + "    ".join(parts[3:])
    figure.text(0.01, 0.06 / height, legend, fontsize=7, color="0.3")
    with warnings.catch_warnings():
        # A glyph the monospace font lacks shows as a box; the HTML has the exact text.
        warnings.filterwarnings("ignore", "Glyph .* missing from font", UserWarning)
        figure.savefig(path, dpi=dpi)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
ul.tree, ul.tree ul { list-style: none; padding-left: 1.6em; border-left: 1px solid #bbb; }
.card { border: 1px solid #888; border-radius: 6px; padding: 0.4em 0.6em; margin: 0.4em 0;
        background: #f8f8f4; }
li.ended > .card { border: 2px solid #d22; }
.nums { font-family: monospace; font-size: 0.9em; margin-bottom: 0.3em; }
.tag { color: #d22; font-weight: bold; }
pre { white-space: pre-wrap; margin: 0.2em 0 0.4em 0; background: #fff; padding: 0.3em;
      border: 1px solid #ddd; }
.agent { font-size: 0.85em; color: #555; }
"""


def write_tree_html(view: TreeView, path: str | Path) -> Path:
    """A self-contained HTML page (no external resources) with every full prompt and
    completion of ``view`` and its exact numbers (``data-reward``, ``data-return``,
    ``data-advantages`` on each node's ``<li>``); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    step = "" if view.env_step is None else f", env_step {view.env_step}"
    norm = _scale_words(view)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Rollout tree of item {view.item_index}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Rollout tree of item {view.item_index}{html.escape(step)}</h1>",
        f"<p>G = {view.num_generations} samples per agent and state, discount "
        f"{view.discount:g}, advantage baseline <code>{html.escape(view.advantage_mode)}</code> "
        f"({norm}), {view.num_agents} agents, {len(view.nodes)} joint actions.</p>",
        "<p>" + "<br>".join(html.escape(part) for part in _LEGEND.split("    ")) + "</p>",
        '<div class="root"><h2>Turn-1 prompts</h2>',
        *_pres("prompt", view.root_prompts),
        "</div>",
        _html_children(view, None),
        "</body></html>",
    ]
    path.write_text("\n".join(parts) + "\n", "utf-8")
    return path


def _pres(kind: str, texts: tuple[str, ...]) -> list[str]:
    return [
        f'<div class="agent">agent_{a}</div><pre class="{kind}" data-agent="{a}">'
        f"{html.escape(text)}</pre>"
        for a, text in enumerate(texts)
    ]


def _html_children(view: TreeView, parent: int | None) -> str:
    children = view.children(parent)
    if not children:
        return ""
    items = []
    for node in children:
        advantages = ", ".join(f"{a:+.3f}" for a in node.advantages)
        ended = ' <span class="tag">ended early</span>' if node.ended_early else ""
        prompts = ""
        if node.turn > 1:
            prompts = "<details><summary>prompts</summary>" + "".join(_pres("prompt", node.prompts))
            prompts += "</details>"
        items.append(
            f'<li class="node{" ended" if node.ended_early else ""}" id="node-{node.id}" '
            f'data-node="{node.id}" data-turn="{node.turn}" data-reward="{node.reward!r}" '
            f'data-return="{node.turn_return!r}" '
            f'data-advantages="{html.escape(json.dumps(list(node.advantages)))}">'
            f'<div class="card"><div class="nums">turn {node.turn} · sample '
            f"{list(node.sample)} · r {node.reward:.3f} · R {node.turn_return:.3f} · "
            f"A [{advantages}]{ended}</div>"
            + "".join(_pres("completion", node.completions))
            + prompts
            + "</div>"
            + _html_children(view, node.id)
            + "</li>"
        )
    return '<ul class="tree">' + "".join(items) + "</ul>"


def _scale_words(view: TreeView) -> str:
    """How the view's advantages were scaled, for a title."""
    words = {"group": "each group's std", "batch": "the round's std", "none": "not scaled"}
    return words[view.advantage_scale]
