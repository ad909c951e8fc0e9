"""A kernel entry's parameters as dtypes and shapes, for `kcache ls` and `show`: what tells apart the
entries of one kernel name built for other shapes or dtypes.

params.json is TileLang's dump_kernel_params: TVM's JSON node graph of a list of {"dtype", "shape"}
records. It is read here without importing TVM, for display only: a graph this reader does not
understand gives None (or "?" for one dimension), never an error.
"""

from __future__ import annotations

from typing import Any

# A dimension such as `n * 2`: the operators of TVM's arithmetic nodes (tir.Mul, tirx.Mul, ...).
OPERATORS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "FloorDiv": "//", "FloorMod": "%"}
# Far deeper than any shape expression: a deeper (or cyclic) graph is not TileLang's.
MAX_DEPTH = 32


class _Unreadable(Exception):
    pass


def kernel_params(graph: Any) -> list[dict[str, Any]] | None:
    """[{"dtype": "float32", "shape": ["1024"]}, ...] from a parsed params.json, or None if it is not
    a parameter list (a synthetic entry's, a newer format)."""
    try:
        if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
            return None
        records = _value(graph["nodes"], graph.get("root_index"), 0)
    except _Unreadable:
        return None
    if not isinstance(records, list) or not all(isinstance(r, dict) and isinstance(r.get("dtype"), str)
                                                and isinstance(r.get("shape"), list) for r in records):
        return None
    return [{"dtype": record["dtype"], "shape": [str(dim) for dim in record["shape"]]} for record in records]


def describe_params(params: list[dict[str, Any]] | None) -> str:
    """"float32[1024] x3", "float16[m,k], float16[k,n], float32[m,n]"; "-" when unknown."""
    if params is None:
        return "-"
    groups: list[list[Any]] = []  # [text, repeats]: consecutive equal parameters once
    for param in params:
        text = param["dtype"] + (f"[{','.join(param['shape'])}]" if param["shape"] else "")
        if groups and groups[-1][0] == text:
            groups[-1][1] += 1
        else:
            groups.append([text, 1])
    return ", ".join(text + (f" x{repeats}" if repeats > 1 else "") for text, repeats in groups) or "none"


def _value(nodes: list[Any], index: Any, depth: int) -> Any:
    if depth > MAX_DEPTH or not isinstance(index, int) or not 0 <= index < len(nodes):
        raise _Unreadable
    node = nodes[index]
    if not isinstance(node, dict):
        raise _Unreadable
    kind, data = str(node.get("type", "")), node.get("data")
    if kind in ("ffi.String", "ffi.SmallStr", "int", "float", "bool"):
        return data
    if kind == "ffi.Array" and isinstance(data, list):
        return [_value(nodes, item, depth + 1) for item in data]
    if kind == "ffi.Map" and isinstance(data, list):
        keys, values = data[0::2], data[1::2]
        return {str(_value(nodes, k, depth + 1)): _value(nodes, v, depth + 1) for k, v in zip(keys, values)}
    return _expression(nodes, kind.rpartition(".")[2], data, depth)


def _expression(nodes: list[Any], kind: str, data: Any, depth: int) -> str:
    """One dimension that is not a plain integer: an IntImm, a variable, or arithmetic on them."""
    if not isinstance(data, dict):
        return "?"
    if kind == "IntImm" and isinstance(data.get("value"), int):
        return str(data["value"])  # a POD field: held inline, not a node's index
    if kind in ("Var", "SizeVar"):
        name = _value(nodes, data.get("name"), depth + 1)
        return name if isinstance(name, str) else "?"
    if kind in OPERATORS and "a" in data and "b" in data:
        return f"{_value(nodes, data['a'], depth + 1)}{OPERATORS[kind]}{_value(nodes, data['b'], depth + 1)}"
    return "?"
