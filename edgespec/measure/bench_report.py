"""The table `edgespec bench` prints (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_report(result: dict, console: Console | None = None) -> None:
    """Per drafter × k × temperature × prompt set, then costs and the recommendation."""
    console = console or Console(width=170)
    table = Table(title=f"edgespec bench — target {result['target']}, "
                        f"max {result['config']['max_tokens']} tokens, "
                        f"{result['config']['prompts_per_set']} prompts per set")
    for column in ("set", "T", "drafter", "k", "acceptance", "mean acc. len", "per position",
                   "tok/s", "× plain (geo. mean)", "(median)", "(min–max)", "drafter MB"):
        table.add_column(column, justify="right")
    rows = sorted(result["summary"], key=lambda r: (r["prompt_set"], r["temperature"], r["sampling"],
                                                   ("plain", "fixed", "auto").index(r["mode"]),
                                                   r["drafter"], r["num_draft"]))
    previous = None
    for r in rows:
        group = (r["prompt_set"], r["temperature"], r["sampling"])
        if previous is not None and group != previous:
            table.add_section()
        previous = group
        plain = r["mode"] == "plain"
        table.add_row(
            r["prompt_set"], f"{r['temperature']:g}" + (" inv." if r["sampling"] == "invariant" else ""),
            "plain" if plain else r["drafter"],
            "auto" if r["mode"] == "auto" else ("" if plain else str(r["num_draft"])),
            "" if plain else f"{r['acceptance_rate']:.1%}",
            "" if plain else f"{r['mean_accepted_length']:.2f}",
            "" if plain else " ".join(f"{a:.2f}" for a in r["acceptance_per_position"][:8]),
            f"{r['tokens_per_second']:.2f}", f"{r['speedup_geomean']:.2f}", f"{r['speedup_median']:.2f}",
            f"{r['speedup_min']:.2f}–{r['speedup_max']:.2f}",
            f"{r['drafter_memory_bytes'] / 1e6:.0f}" if r["drafter_memory_bytes"] else "")
    console.print(table)
    costs = result["costs"]
    v = ", ".join(f"v({n})={x:.2f}" for n, x in costs["v"].items())
    c = ", ".join(f"c({name})={x:.2f}" for name, x in costs["c"].items())
    console.print(f"this machine: target step {1000 * (costs['target_step_seconds'] or 0):.1f} ms; {v}")
    if c:
        console.print(f"drafter step cost: {c}")
    rec = result["recommendation"]
    if rec["mode"] == "plain":
        console.print(f"recommendation: plain decoding ({rec['reason']})")
    else:
        console.print(f"recommendation: drafter {rec['drafter']}, k={rec['num_draft']} "
                      f"({rec['speedup']:.2f}× geometric mean; {rec['reason']})")
