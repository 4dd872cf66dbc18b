"""Pages generated at build time (mkdocs-gen-files), so the site and the code cannot disagree:

- ``algorithms/<name>.md``: each registered algorithm's hyperparameters with their defaults,
  ranges and meanings, read from its Config dataclass (``agents.config_docs``);
- ``algorithms/hyperparameters.md``: the index of those pages;
- ``record.md``: the full MuJoCo record as ``python -m benchmark record`` last wrote it
  (``results/record/record.md``), with its figures.
"""

from __future__ import annotations

import re
from pathlib import Path

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


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


def algorithm_page(name: str) -> str:
    """One algorithm's page: what it is, what it acts in, every hyperparameter."""
    config_class = registry.config_class(name)
    module, _, learner = registry.REGISTRY[name][1].partition(":")
    kinds = [kind for kind, flag in KINDS if getattr(config_class, flag)]
    lines = [
        f"# {name}",
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
            lines += ["", f"## {heading}", "", "| hyperparameter | type | default | range | meaning |", "|---|---|---|---|---|"]
        lines.append(f"| `{field.name}` | {_cell(field.type)} | `{_cell(field.default)}` | {_cell(field.range)} | {_cell(field.meaning)} |")
    if config_class.aliases:
        lines += ["", "## Aliases", "", "Other libraries' names, accepted and translated ([glossary](../glossary.md)):", ""]
        lines += [f"- `{alias}` for `{name}`" for alias, name in config_class.aliases.items()]
    return "\n".join(lines) + "\n"


def index_page() -> str:
    lines = ["# Hyperparameters by algorithm", "", "| algorithm | published defaults |", "|---|---|"]
    for name in registry.REGISTRY:
        doc = " ".join((registry.config_class(name).__doc__ or "").split())
        lines.append(f"| [{name}]({name}.md) | {_cell(doc)} |")
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
