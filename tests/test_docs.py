"""The documentation: hyperparameter meanings read from the Config classes, and links that resolve.

``make docs`` (in CI) builds the site strictly, which checks the links between its pages; these
tests check what the site build does not see: the README's links, and the field documentation
that both the site and ``list ALGO`` print."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import agents
from agents.config_docs import field_docs
from agents.configs.sac import SACConfig
from agents.hyperparameters import Hyperparameters, hp
from benchmark.cli.app import main

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def test_every_hyperparameter_of_every_algorithm_says_what_it_means():
    missing = {name: [f.name for f in field_docs(agents.config_class(name)) if not f.meaning] for name in agents.ALGORITHMS}
    assert not {name: fields for name, fields in missing.items() if fields}


def test_a_field_reads_its_default_range_meaning_and_declaring_class():
    by_name = {f.name: f for f in field_docs(SACConfig)}
    assert list(by_name)[:2] == ["num_envs", "gamma"]  # base classes' fields first
    tau = by_name["tau"]
    assert (tau.type, tau.default, tau.range, tau.declared_in) == ("float", 0.005, "> 0.0, <= 1.0", "SACConfig")
    assert tau.meaning == "Polyak coefficient of the target critics."
    assert by_name["hidden_sizes"].range == "each >= 1" and by_name["activation"].range.startswith("one of 'tanh'")
    assert by_name["start_steps"].default == 5_000 and by_name["start_steps"].declared_in == "OffPolicyConfig"  # restated default, the base's meaning


def test_a_subclass_restating_a_field_with_a_new_meaning_wins():
    @dataclass
    class Base(Hyperparameters):
        width: int = hp(4, ge=1)
        """Base meaning."""

    @dataclass
    class Child(Base):
        width: int = hp(8, ge=1)
        """Child meaning."""

        depth: int = hp(2, ge=1)

    found = {f.name: f for f in field_docs(Child)}
    assert (found["width"].meaning, found["width"].default, found["width"].declared_in) == ("Child meaning.", 8, "Child")
    assert (found["depth"].meaning, found["depth"].declared_in) == ("", "Child")


def test_list_algo_prints_ranges_and_meanings(capsys):
    assert main(["list", "sac", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "hyperparameter,default,range,meaning"
    assert any(row.startswith("tau,0.005,") and "Polyak coefficient of the target critics." in row for row in rows)


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))])
def test_relative_links_resolve(page):
    """Each relative link of the README and the hand-written pages names a file that exists (the
    algorithms' pages are generated when the site builds, each with its prose from
    algorithms/prose/, whose links therefore read from algorithms/)."""
    source = ROOT / page
    where = source.parent.parent if source.parent.name == "prose" else source.parent
    generated = {f"{name}.md" for name in agents.ALGORITHMS} | {"hyperparameters.md", "record.md"}
    for target, _ in LINK.findall(source.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        if where.name in ("docs", "algorithms") and Path(target).name in generated:
            continue
        assert (where / target).exists(), f"{page} links to {target}, which does not exist"


def test_every_algorithm_has_a_page_in_the_sites_navigation_with_its_prose():
    """Each registered algorithm: a page in mkdocs.yml's navigation, and prose with what it is, its
    papers, its equations (each converts to MathML: the site draws them with no script), how it is
    implemented and where it differs, and how to run it."""
    import latex2mathml.converter

    from agents import registry

    nav = (ROOT / "mkdocs.yml").read_text()
    for name in registry.REGISTRY:
        assert f"algorithms/{name}.md" in nav, f"{name} is not in the site's navigation"
        prose = (ROOT / "docs" / "algorithms" / "prose" / f"{name}.md").read_text()
        for part in ("**Papers:**", "## The update", "## How it is implemented here", "### Where it differs", "## Run it"):
            assert part in prose, f"{name}'s page has no {part!r}"
        equations = re.findall(r"^\$\$\n(.*?)\n\$\$$", prose, re.S | re.M)
        assert equations, f"{name}'s page has no display equation"
        for equation in equations:
            assert "<math" in latex2mathml.converter.convert(equation.strip(), display="block")
        assert re.search(r"python -m benchmark (train|run) ", prose), f"{name}'s page says not how to run it"
