"""docs/operations.md lists every message kcache gives, with its cause and its fix (the README says so):
every warning and exception of kcache's Triton and Helion layers is in its table (issue 68). The messages
are read from the code (ast): each warning's text (a `log.warning`, a warn-once helper's, a line written
to stderr) must have its longest fixed part in the table, and each kcache exception these layers raise its
name. A message added without a row fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
LAYERS = ("kcache/triton", "kcache/helion")
# printf and f-string placeholders: what varies in a message (a unit right after one, "%g s", goes too).
PLACEHOLDER = re.compile(r"(?:%[-#0 +]*\d*(?:\.\d+)?[sdgfr]|\{[^{}]*\})(?: s\b)?")


def table() -> str:
    """The "When something goes wrong" section, where the table is."""
    text = (PROJECT / "docs" / "operations.md").read_text()
    return text.split("\n## When something goes wrong\n", 1)[1].split("\n## ", 1)[0]


def literal(node: ast.AST, function: ast.AST | None) -> str | None:
    """A message's text with its placeholders as `{}`: a string, an f-string, a sum of them, or a name
    assigned one in the same function."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return (literal(node.left, function) or "{}") + (literal(node.right, function) or "{}")
    if isinstance(node, ast.Name) and function is not None:
        for assignment in ast.walk(function):
            if isinstance(assignment, ast.Assign) and any(isinstance(target, ast.Name) and target.id == node.id
                                                          for target in assignment.targets):
                return literal(assignment.value, function)
    return None


def message_argument(call: ast.Call) -> ast.AST | None:
    function = call.func
    if (isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name) and function.value.id == "log"
            and function.attr in ("warning", "error") and call.args):
        return call.args[0]
    if isinstance(function, ast.Name) and function.id == "_warn_once" and len(call.args) >= 2:
        return call.args[1]
    if (isinstance(function, ast.Attribute) and function.attr == "write" and isinstance(function.value, ast.Attribute)
            and function.value.attr == "stderr" and call.args):
        return call.args[0]
    return None


def messages() -> dict[str, str]:
    """`path:line` -> the longest fixed part of the message given there."""
    found = {}
    for layer in LAYERS:
        for path in sorted((PROJECT / layer).rglob("*.py")):
            tree = ast.parse(path.read_text())
            functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
                argument = message_argument(call)
                if argument is None:
                    continue
                around = [f for f in functions if f.lineno <= call.lineno <= (f.end_lineno or f.lineno)]
                function = max(around, key=lambda f: f.lineno) if around else None
                if function is not None and function.name == "_warn_once":
                    continue  # the helper itself: its callers' messages are read where they call it
                text = literal(argument, function)
                if text is None and isinstance(argument, ast.IfExp | ast.Call):
                    continue  # no text of kcache's own: a relay of what a child printed (isolation._relay)
                assert text is not None, f"{path}:{call.lineno}: a message this test cannot read; give it a literal"
                parts = [part.strip(" .;:,()'`\n").removeprefix("kcache: ") for part in PLACEHOLDER.split(text)]
                found[f"{path.relative_to(PROJECT)}:{call.lineno}"] = max(parts, key=len)
    return found


def raised_kcache_errors() -> set[str]:
    """The names of kcache's exception classes that the layers raise."""
    import kcache.errors
    import kcache.triton.errors  # noqa: F401 - needs Triton: the test module skips without it

    ours = {name for module in (kcache.errors, kcache.triton.errors) for name in dir(module)
            if isinstance(getattr(module, name), type) and issubclass(getattr(module, name), kcache.errors.KCacheError)}
    names = set()
    for layer in LAYERS:
        for path in sorted((PROJECT / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name)
                        and node.exc.func.id in ours):
                    names.add(node.exc.func.id)
    return names


def test_every_triton_and_helion_warning_is_in_the_table() -> None:
    found = messages()
    assert len(found) >= 18, found  # the reader sees them all: a refactor that hides them fails here
    section = table()
    missing = {where: part for where, part in found.items() if len(part) < 10 or part not in section}
    assert missing == {}, f"messages without a row in docs/operations.md's table (or too short to find): {missing}"


def test_every_kcache_exception_they_raise_is_in_the_table() -> None:
    pytest.importorskip("triton", reason="kcache.triton.errors subclasses Triton's errors (pip install -e '.[test]')")
    raised = raised_kcache_errors()
    assert {"TritonCompilerCrashed", "TritonCompileTimeout"} <= raised, raised
    section = table()
    assert sorted(name for name in raised if f"{name}" not in section) == []


def test_the_crash_row_does_not_promise_the_next_call_works() -> None:
    """A remembered Triton crash is not compiled again: the row says so, and how to compile it again."""
    rows = [row for row in table().splitlines() if "TritonCompilerCrashed" in row]
    assert rows and all("next call works" not in row for row in rows), rows
    assert any("remembered" in row and "kcache clear" in row for row in rows), rows
