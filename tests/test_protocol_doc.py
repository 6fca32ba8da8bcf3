"""docs/protocol.md keeps up with the code: its constants, names, examples and dtype codes.

Reads the package's *source files* beside this test (ast, and layout.py loaded on its own), so it
imports neither torch nor whichever fsdist happens to be installed, and takes milliseconds.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import re
import struct
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SPEC = (REPO / "docs" / "protocol.md").read_text()

#: constants the spec must quote (a row deleted from its table fails here, not silently)
MUST_QUOTE = {
    "MAGIC", "VERSION", "_FIXED", "_PART", "_MAGIC", "_HEADER", "HEADER_SIZE", "DESCRIPTION_MAX", "FORMAT",
    "ALLREDUCE_SLICED_MIN_BYTES", "GC_EVERY", "RUN_AHEAD", "MAX_UNRECEIVED_SENDS", "REUSE_FILES", "_MAX_KEY_NAME",
}  # fmt: skip


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", SPEC, re.S | re.M)
    assert match, f"docs/protocol.md has no section '## {title}'"
    return match.group(1)


def _source_constants(relpath: str) -> dict[str, Any]:
    """Module-level ``NAME = expr`` of a source file, for every expr computable from earlier ones."""
    path = REPO / relpath
    values: dict[str, Any] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level and node.module:  # fsdist's own constants
            base = Path(relpath).parent.parts[: len(Path(relpath).parent.parts) - (node.level - 1)]
            module = Path(*base, *node.module.split(".")).with_suffix(".py")
            if not (REPO / module).is_file():
                continue  # a package: its modules are imported, not constants
            imported = _source_constants(str(module))
            values.update({a.asname or a.name: imported[a.name] for a in node.names if a.name in imported})
            continue
        if isinstance(node, ast.Assign):
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target = node.target
        else:
            continue
        if not isinstance(target, ast.Name):
            continue
        try:
            code = compile(ast.Expression(node.value), str(path), "eval")
            values[target.id] = eval(code, {"__builtins__": {}, "struct": struct}, values)
        except Exception:  # noqa: BLE001 - needs imports or the environment: not a quotable constant
            continue
    return values


def _load_layout() -> Any:
    spec = importlib.util.spec_from_file_location("_layout_under_test", REPO / "fsdist/protocol/layout.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # stdlib imports only
    return module


def test_every_quoted_constant_equals_the_code() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)`[^|]*\| `([\w/.]+\.py)` \|", _section("Constants"), re.M)
    assert len(rows) == _section("Constants").count("\n| `"), "a row of the constants table does not parse"
    assert MUST_QUOTE <= {name for name, _, _ in rows}, f"not quoted: {MUST_QUOTE - {n for n, _, _ in rows}}"
    for name, quoted, module in rows:
        code = _source_constants(module)
        assert name in code, f"{module} defines no constant {name} (quoted in docs/protocol.md)"
        actual = code[name].format if isinstance(code[name], struct.Struct) else code[name]
        assert ast.literal_eval(quoted) == actual, f"docs/protocol.md: {name} = {quoted}, {module} has {actual!r}"


def test_every_file_name_of_the_layout_is_in_the_directory_tree() -> None:
    tree = re.search(r"```\n(.*?)```", _section("Directory tree"), re.S)
    assert tree
    layout = _load_layout()
    placeholders = {"rank": "<rank>", "seq": "<seq>", "step": "<step>", "src": "<src>", "dst": "<dst>",
                    "index": "<index>", "number": "<n>", "generation_id": "<16 hex>", "node": "<node>"}  # fmt: skip
    names = []
    for attr in layout.__all__:
        value = getattr(layout, attr)
        if attr == "GROUP_RANKS_KEY":
            names.append(layout.key_to_filename(value))
        elif isinstance(value, str):
            names.append(value)
        elif attr.endswith(("_file", "_name", "_dir")) and not attr.startswith("is_") and attr != "group_dir":
            params = inspect.signature(value).parameters  # folders become "", so only the name is left
            name = value(*(placeholders.get(p, "") for p in params))
            names.append(re.sub(r"-[0-9a-f]{12}-", "-<12 hex>-", name))  # a node tier: its node id's hash
    assert len(names) > 15
    missing = [name for name in names if name not in tree.group(1)]
    assert not missing, f"layout.py names missing from docs/protocol.md's directory tree: {missing}"


def test_key_escaping_examples() -> None:
    layout = _load_layout()
    rows = re.findall(r"^\| `(\"[^`]*)` \| `([^`]+)` \|$", _section("Directory tree"), re.M)
    assert len(rows) >= 4
    for key_expression, name in rows:
        key = eval(key_expression, {"__builtins__": {}})
        assert layout.key_to_filename(key) == name, f"{key_expression}: {layout.key_to_filename(key)}, docs say {name}"
        assert name.startswith("h.") or layout.filename_to_key(name) == key


def test_history_hash_example() -> None:
    source = (REPO / "fsdist/protocol/state_record.py").read_text()
    (chain_def,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "chain"]
    namespace: dict[str, Any] = {"hashlib": hashlib}
    exec(compile(ast.Module([chain_def], []), "state_record.py", "exec"), namespace)
    match = re.search(
        r"first operation is\s+`([^`]+)`\s+and second\s+`([^`]+)`\s+has\s+`h\(1\) = (0x[0-9a-f]+)`\s+and\s+"
        r"`h\(2\) = (0x[0-9a-f]+)`",
        SPEC,
    )
    assert match, "docs/protocol.md lost its history hash example"
    first, second, h1, h2 = match.groups()
    assert namespace["chain"](0, first) == int(h1, 16)
    assert namespace["chain"](int(h1, 16), second) == int(h2, 16)


def test_dtype_codes() -> None:
    body = ast.parse((REPO / "fsdist/protocol/message.py").read_text()).body
    names: list[str] = []
    for node in body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_DTYPES":
            names += [element.attr for element in node.value.elts]  # type: ignore[union-attr]
        if isinstance(node, ast.For) and getattr(node.target, "id", "") == "_name":
            names += [element.value for element in node.iter.elts]  # type: ignore[attr-defined]
    documented = dict(re.findall(r"\| (\d+) \| (\w+) ", _section("Messages")))
    assert documented == {str(code): name for code, name in enumerate(names, start=1)}
