"""The docs keep up with the code: every public name and CLI flag is documented, links resolve."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import fsdist
from fsdist.cli import main as cli

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _all_docs() -> str:
    return "\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))


def test_every_public_name_has_a_docstring_and_a_line_in_the_reference() -> None:
    reference = (DOCS / "reference.md").read_text()
    for name in fsdist.__all__:
        assert f"fsdist.{name}" in reference, f"fsdist.{name} is missing from docs/reference.md"
        if name != "__version__":
            assert getattr(fsdist, name).__doc__, f"fsdist.{name} has no docstring"


def test_every_cli_flag_has_help_and_is_documented() -> None:
    docs = _all_docs()
    for name, module_name, help_text in cli._COMMANDS:
        assert help_text, name
        assert f"fsdist {name}" in docs, f"`fsdist {name}` is documented nowhere in docs/"
        parser = argparse.ArgumentParser(prog=f"fsdist {name}")
        importlib.import_module(f"fsdist.cli.{module_name}").add_arguments(parser)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"fsdist {name}: {action.option_strings or action.dest} has no help text"
            for flag in action.option_strings:
                if flag.startswith("--"):
                    assert f"`{flag}" in docs, f"fsdist {name} {flag} is documented nowhere in docs/"


def test_relative_links_resolve() -> None:
    pages = [REPO / "README.md", REPO / "examples" / "README.md", *DOCS.glob("*.md")]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", page.read_text()):
            if "://" in target:
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.exists(), f"{page.relative_to(REPO)} links to missing {target}"


def test_mkdocs_nav_lists_every_page() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    for page in DOCS.glob("*.md"):
        assert f": {page.name}" in nav, f"docs/{page.name} is not in mkdocs.yml's nav"


#: pages that make promises about behaviour: what they name must exist
_PROMISES = ["errors.md", "limitations.md", "reliability.md", "reference.md", "init-methods.md"]


def _package_sources() -> str:
    return "\n".join(p.read_text() for p in Path(fsdist.__file__).parent.rglob("*.py"))


def test_every_environment_variable_the_package_reads_is_in_the_reference() -> None:
    reference = (DOCS / "reference.md").read_text()
    read = set(re.findall(r"\b(FSDIST_[A-Z_]+)\b", _package_sources()))
    missing = sorted(name for name in read if f"`{name}" not in reference)
    assert not missing, f"read by fsdist but not in docs/reference.md's table: {missing}"


def test_every_environment_variable_the_docs_name_exists() -> None:
    docs = _all_docs() + (REPO / "README.md").read_text()
    elsewhere = _package_sources() + "".join(
        p.read_text() for p in [*REPO.glob("scripts/**/*.sh"), *REPO.glob("tests/**/*.py"), REPO / "Makefile"]
    )
    named = set(re.findall(r"\b(FSDIST_[A-Z_]+)\b", docs))
    unknown = sorted(name for name in named if name not in elsewhere)
    assert not unknown, f"docs name variables nothing reads: {unknown}"


def test_every_error_class_the_docs_name_exists() -> None:
    import builtins

    import torch.distributed as dist

    known = set(fsdist.errors.__all__) | {n for n in dir(builtins) if n.endswith("Error")}
    known |= {n for n in dir(dist) if n.endswith("Error")}
    for page in _PROMISES:
        named = set(re.findall(r"\b([A-Z][A-Za-z]*Error)\b", (DOCS / page).read_text()))
        unknown = sorted(named - known)
        assert not unknown, f"docs/{page} names error classes that do not exist: {unknown}"


def test_every_test_the_reliability_page_cites_exists() -> None:
    tests = REPO / "tests"
    for module, name in re.findall(r"`(test_\w+)\.py::(\w+)", (DOCS / "reliability.md").read_text()):
        source = (tests / f"{module}.py").read_text()
        assert f"def {name}" in source, f"docs/reliability.md cites {module}.py::{name}, which does not exist"


def test_the_design_page_lists_every_module_once() -> None:
    """docs/design.md's module table is the one module list: it names every module of the
    package (its ``__init__``s aside) and no module that is gone."""
    package = Path(fsdist.__file__).parent
    modules = {
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py", "_version.py")
    }
    table = (DOCS / "design.md").read_text().split("Every module", 1)[1].split("\n\n## ", 1)[0]
    listed = re.findall(r"^\| `([\w/]+\.py)` \|", table, flags=re.M)
    assert len(listed) == len(set(listed)), "a module is listed twice in docs/design.md"
    assert not modules - set(listed), f"modules missing from docs/design.md: {sorted(modules - set(listed))}"
    assert not set(listed) - modules, f"docs/design.md lists modules that do not exist: {sorted(set(listed) - modules)}"


def _life_of_an_all_reduce() -> tuple[list[str], list[str]]:
    """The files docs/design.md's "Life of an all_reduce" names for a small one, and for a large one."""
    life = (DOCS / "design.md").read_text().split("## Life of an all_reduce", 1)[1].split("\n## ", 1)[0]
    small, large = life.split("**Large**", 1)
    return re.findall(r"`([\w/]+\.py)`", small), re.findall(r"`([\w/]+\.py)`", large)


def test_the_life_of_an_all_reduce_names_real_files_and_every_file_one_enters(pool_factory) -> None:
    """The newcomer's map in docs/design.md against the tree and against a traced all_reduce: a
    file the map names exists, and a file one all_reduce enters is on the map."""
    from in_rank import collectives

    small, large = _life_of_an_all_reduce()
    package = Path(fsdist.__file__).parent
    for name in small + large:
        assert (package / name).is_file(), f"docs/design.md's life of an all_reduce names {name}: no such module"
    small_entered, large_entered = pool_factory(2).run(collectives.files_an_all_reduce_enters, [2, 4 << 20])[0]
    assert not set(small_entered) - set(small), f"a small all_reduce enters {sorted(set(small_entered) - set(small))}"
    off_map = set(large_entered) - set(small) - set(large)
    assert not off_map, f"a large all_reduce enters {sorted(off_map)}, not on the map"
