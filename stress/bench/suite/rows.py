"""A row of the bench's table, as every scenario reports its readings, and the table printed."""

from __future__ import annotations

from typing import Any


def row(scenario: str, metric: str, kc: float, tl: float | None, unit: str,
        baseline: str = "tilelang") -> dict[str, Any]:
    """A reading of `scenario`'s `metric` in `unit`: kcache's value `kc` beside the baseline's `tl` (the
    one named by `baseline`; the key "tilelang" holds it whatever it is), and their ratio."""
    return {"scenario": scenario, "metric": metric, "kcache": kc, "tilelang": tl,
            "ratio": (kc / tl) if tl else None, "unit": unit, "baseline": baseline}


def format_value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def print_table(rows: list[dict[str, Any]]) -> None:
    """The bench's table: a row a line, each beside its baseline ("tilelang" holds its value)."""
    print(f"{'scenario':<26} {'metric':<44} {'kcache':>10} {'baseline':>10} {'ratio':>7} unit  baseline")
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        print(f"{r['scenario']:<26} {r['metric']:<44} {format_value(r['kcache']):>10} "
              f"{format_value(r['tilelang']):>10} {ratio:>7} {r['unit']:<5} {r['baseline']}")
