"""Pages generated at build time (mkdocs-gen-files), so the site and the code cannot disagree:

- ``algorithms/<name>.md``: each registered algorithm's page: its prose
  (``docs/algorithms/prose/<name>.md``: what it is, papers, equations, implementation and
  deviations, how to run it; display equations between ``$$`` lines become MathML here, which
  browsers draw with no script or network), its rows of the record and of the parity table with
  the learning-curve grid they are drawn in, and its hyperparameters with their defaults, ranges
  and meanings, read from its Config dataclass (``agents.config_docs``);
- ``algorithms/hyperparameters.md``: the index of those pages;
- ``record.md``: the full MuJoCo record as ``python -m benchmark record`` last wrote it
  (``results/record/record.md``), with its figures.
"""

from __future__ import annotations

import re
from pathlib import Path

import latex2mathml.converter
import mkdocs_gen_files

from agents import registry
from agents.config_docs import field_docs

ROOT = Path(__file__).resolve().parent.parent
SHARED = {
    "Hyperparameters": "Shared by every algorithm",
    "OnPolicyConfig": "Shared by the on-policy algorithms",
    "OffPolicyConfig": "Shared by the off-policy algorithms",
    "PolicyGradientOptions": "Shared by the policy-gradient algorithms (on-policy and MAML)",
    "SurrogateConfig": "Shared by PPO, PPO-KL and the surrogate PG",
    "MAMLConfig": "Shared by the MAML variants",
    "DDPGConfig": "Shared with DDPG",
    "VPGConfig": "Shared with VPG",
}
KINDS = (("discrete", "supports_discrete"), ("multi-discrete", "supports_multi_discrete"), ("box", "supports_continuous"))
TITLES = {
    "vpg": "VPG: vanilla policy gradient",
    "reinforce": "REINFORCE",
    "a2c": "A2C: advantage actor-critic",
    "ppo": "PPO: proximal policy optimization",
    "ppo_kl": "PPO-KL: PPO with an adaptive KL penalty",
    "surrogate_pg": "Surrogate PG: the unclipped surrogate objective",
    "trpo": "TRPO: trust region policy optimization",
    "ddpg": "DDPG: deep deterministic policy gradient",
    "td3": "TD3: twin delayed DDPG",
    "sac": "SAC: soft actor-critic",
    "dqn": "DQN: deep Q-network",
    "mpo": "MPO: maximum a posteriori policy optimization",
    "bc": "BC: behavioural cloning",
    "maml_vpg": "MAML-VPG: model-agnostic meta-learning, VPG outer step",
    "maml_ppo": "MAML-PPO: model-agnostic meta-learning, PPO outer step",
    "maml_trpo": "MAML-TRPO: model-agnostic meta-learning, TRPO outer step",
    "pearl": "PEARL: probabilistic embeddings for actor-critic RL",
}
DISPLAY_MATH = re.compile(r"^\$\$\n(.*?)\n\$\$$", re.S | re.M)


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


def title(name: str) -> str:
    return TITLES.get(name, name)


def with_mathml(text: str) -> str:
    """``text`` with each display equation (a ``$$`` line, the LaTeX, a ``$$`` line) as MathML."""
    return DISPLAY_MATH.sub(lambda match: "\n" + latex2mathml.converter.convert(match.group(1).strip(), display="block") + "\n", text)


def record_tables(name: str) -> tuple[list[str], list[str]]:
    """The algorithm's rows of every table of the full record (its cells, its aggregate, its parity
    cell), each under its table's header; and the learning-curve grids its cells are drawn in."""
    path = ROOT / "results" / "record" / "record.md"
    if not path.is_file():
        return [], []
    lines, found, grids = path.read_text().splitlines(), [], []
    index = 0
    while index < len(lines):
        if lines[index].startswith("| ") and index + 1 < len(lines) and lines[index + 1].startswith("|---"):
            header, rows = lines[index : index + 2], []
            index += 2
            while index < len(lines) and lines[index].startswith("| "):
                if lines[index].split("|")[1].strip() == name:
                    rows.append(lines[index])
                index += 1
            if rows:
                found += ["", *header, *rows]
                grids += [f"curves_{row.split('|')[3].strip()}.png" for row in rows if row.split("|")[3].strip() in ("1M", "300k")]
        else:
            index += 1
    return found, [grid for grid in dict.fromkeys(grids) if (ROOT / "results" / "record" / grid).is_file()]


def algorithm_page(name: str) -> str:
    """One algorithm's page: its prose, its rows of the record, what it acts in, every hyperparameter."""
    config_class = registry.config_class(name)
    module, _, learner = registry.REGISTRY[name][1].partition(":")
    kinds = [kind for kind, flag in KINDS if getattr(config_class, flag)]
    prose = ROOT / "docs" / "algorithms" / "prose" / f"{name}.md"
    lines = [f"# {title(name)}", ""]
    if prose.is_file():
        lines += [with_mathml(prose.read_text()).rstrip(), ""]
    tables, grids = record_tables(name)
    if tables:
        lines += [
            "## In the record",
            "",
            "Its cells of the [MuJoCo record](../record.md) (verdicts under the rule of [results and verdicts](../results.md)), "
            "written by `python -m benchmark record` from the committed bundles:",
            *tables,
            "",
            *(f"![{grid}](../record/{grid})" for grid in grids),
            "",
        ]
    lines += [
        "## Hyperparameters",
        "",
        " ".join((config_class.__doc__ or "").split()),
        "",
        f"- learner: `{module}.{learner}` (`{module.replace('.', '/')}.py`); settings: `{config_class.__module__}.{config_class.__name__}`",
        f"- action spaces: {', '.join(kinds)}",
        f"- meta-learner: {'yes (trained by epochs over a task family)' if config_class.meta_learning else 'no'}",
        "",
        f"Set any of these in a suite (`hyperparameters:`) or a study's search space; `python -m benchmark list {name}` prints the same table.",
        "",
    ]
    owner = None
    for field in field_docs(config_class):
        if field.declared_in != owner:
            owner = field.declared_in
            heading = SHARED.get(owner, f"{name}'s own" if owner == config_class.__name__ else f"From `{owner}`")
            lines += ["", f"### {heading}", "", "| hyperparameter | type | default | range | meaning |", "|---|---|---|---|---|"]
        lines.append(f"| `{field.name}` | {_cell(field.type)} | `{_cell(field.default)}` | {_cell(field.range)} | {_cell(field.meaning)} |")
    if config_class.aliases:
        lines += ["", "### Aliases", "", "Other libraries' names, accepted and translated ([glossary](../glossary.md)):", ""]
        lines += [f"- `{alias}` for `{name}`" for alias, name in config_class.aliases.items()]
    return "\n".join(lines) + "\n"


def index_page() -> str:
    lines = ["# Hyperparameters by algorithm", "", "| algorithm | published defaults |", "|---|---|"]
    for name in registry.REGISTRY:
        doc = " ".join((registry.config_class(name).__doc__ or "").split())
        lines.append(f"| [{title(name)}]({name}.md) | {_cell(doc)} |")
    return "\n".join(lines) + "\n"


def record_page() -> str:
    """The full record as ``python -m benchmark record`` wrote it (results/record/record.md:
    every column, every row's tests, aggregates, parity, figures), images relinked to copies."""
    text = (ROOT / "results" / "record" / "record.md").read_text()
    text = re.sub(r"\]\(([A-Za-z0-9_.-]+\.png)\)", r"](record/\1)", text)
    return "---\nhide:\n  - toc\n---\n\n" + text


for algorithm in registry.REGISTRY:
    with mkdocs_gen_files.open(f"algorithms/{algorithm}.md", "w") as page:
        page.write(algorithm_page(algorithm))
with mkdocs_gen_files.open("algorithms/hyperparameters.md", "w") as page:
    page.write(index_page())
with mkdocs_gen_files.open("record.md", "w") as page:
    page.write(record_page())
for image in sorted((ROOT / "results" / "record").glob("*.png")):
    with mkdocs_gen_files.open(f"record/{image.name}", "wb") as copy:
        copy.write(image.read_bytes())
