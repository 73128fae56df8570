"""EXPLAIN: print a plan as a table (text), as JSON, or as a Graphviz graph (dot, or svg drawn by
Graphviz). In a notebook the text form shows as an HTML table (``Explanation``, tensordb.notebook).

``render(decomp, plan, result=None)`` is a pure function of the optimizer's Decomposition (which
carries its cost: explain renders estimates and makes none), the placed TilePlan and, for
EXPLAIN ANALYZE, the run's statistics. It plans and runs nothing: ``Connection.explain`` does
(on a statement or a graph) and passes what it got here. See docs/explain.md for how to read the
output.

The text form is a header with totals, then one row per operation: its expression, pieces per
label (output labels | aggregated labels), the tile shape of one kernel call, kernel calls,
aggregation fan-in, estimated flops, bytes the placed plan moves between workers, the cost
model's figure, the projected peak per worker (what its largest kernel call holds: copied input
tiles, output tile, accumulator, kernel temporaries; the header sets the plan's peak against
``memory_limit / workers``), and the kernel the plan chose (``matmul x0@x1``, ``contract``,
``broadcast by j``); under each row, the runner-up pieces the search considered with their costs.
EXPLAIN ANALYZE adds the measured time, kernel calls, bytes moved and peak tile memory.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

from .config import format_bytes
from .errors import ProgrammingError
from .notebook import dot_svg, escape

__all__ = ["render", "check_format", "plan_summary", "explain_html", "Explanation", "FORMATS"]

FORMATS = ("text", "json", "dot", "svg")


class Explanation(str):
    """EXPLAIN's text form, which keeps the plan it shows: ``.plan`` (the JSON form's data) and
    ``.dot`` (the Graphviz form). A notebook shows it as an HTML table; ``draw()`` is the plan as
    an SVG picture (needs Graphviz's ``dot`` program)."""

    plan: dict
    dot: str

    def __new__(cls, text: str, plan: dict | None = None, dot: str = "") -> "Explanation":
        self = super().__new__(cls, text)
        self.plan, self.dot = plan, dot
        return self

    def _repr_html_(self) -> str | None:
        return explain_html(self.plan) if self.plan is not None else None

    def draw(self):
        """The plan drawn by Graphviz, as an ``Svg`` a notebook shows."""
        return dot_svg(self.dot)


def check_format(format: str) -> None:
    """Refuse an unknown format, before anything is planned."""
    if format not in FORMATS:
        raise ProgrammingError(f"unknown EXPLAIN format '{format}'",
                               hint=f"valid formats: {', '.join(FORMATS)}")


def plan_summary(decomp, plan, result=None, resident=None, device: bool = False
                 ) -> dict[str, Any]:
    """Everything EXPLAIN shows, as plain data (this is the JSON form). ``resident``: on a GPU,
    per stored input what its Loads find on the devices before the run (the executor's
    ``resident(plan)``). ``device``: the executor is a GPU: a sparse kernel's ``text`` is what
    it runs there (``plan.kernel.device_describe``: cupyx, or densified), its CPU form
    ``cpu_text``."""
    from .plan.device_kernel import device_describe
    from .plan.kernel import SPARSE_METHODS
    from .physical.placement import transfers, worker_flops
    cost = decomp.details.get("cost")
    if cost is None:
        raise ProgrammingError(f"the decomposition '{decomp.strategy}' carries no cost: EXPLAIN "
                               "renders the optimizer's estimate and does not make one",
                               hint="price it first: optimizer.price(graph, decomposition)")
    choices = decomp.details.get("choices", {})
    stored = decomp.details.get("inputs", {})  # stored inputs' formats, nnz, payload bytes
    mem = decomp.details.get("memory")   # a plan.memory.PlanMemory, when the optimizer made one
    moved, moved_per_op = transfers(plan)
    nodes = []
    for i, op in enumerate(plan.ops):
        stats = plan.stats[i] if i < len(plan.stats) else None
        pieces = decomp.pieces(op.output) if op.output in decomp.pieces_by_op else dict(stats.pieces)
        pieces = {l: int(pieces.get(l, 1)) for l in op.labels}
        tile = {l: -(-op.size[l] // pieces[l]) if op.size[l] else 0 for l in op.labels}
        cuts = decomp.details.get("cuts", {}).get(op.output, {})  # optimizer/balance.py
        tile.update({l: max(b[k + 1] - b[k] for k in range(len(b) - 1))
                     for l, b in cuts.items() if l in tile and len(b) > 1})
        c = cost.ops.get(op.output)
        node: dict[str, Any] = {
            "output": op.output,
            "expression": op.describe(),
            "labels": list(op.labels),
            "out_labels": list(op.out_labels),
            "aggregated_labels": list(op.agg_labels),
            "pieces": pieces,
            "tile_shape": tile,
            "kernel_calls": stats.kernel_calls if stats else math.prod(pieces.values()),
            "fan_in": stats.max_fan_in if stats and stats.max_fan_in else
            math.prod(pieces[l] for l in op.agg_labels),
            "aggregations": stats.aggregations if stats else 0,
            "aggregation_levels": stats.agg_levels if stats else 0,
            "flops": int(stats.flops) if stats else int(op.flops),
            "bytes_moved": int(moved_per_op[i]),
            "retile_bytes": int(stats.retile_bytes) if stats else 0,
            "kernel": plan.kernels[i].summary(),
            "inputs": [{"tensor": o.tensor, "labels": o.labels,
                        **({"format": stored[o.tensor]["format"],
                            "nnz": stored[o.tensor]["nnz"],
                            "bytes": stored[o.tensor]["bytes"],
                            **({"fill": stored[o.tensor]["fill"]}
                               if "fill" in stored[o.tensor] else {})}
                           if o.tensor in stored else {})}
                       for o in op.inputs],
        }
        if c is not None and plan.kernels[i].sparse is not None:
            node["flops"] = int(c.flops)  # the sparse kernel's, from the catalog's nnz
        if device and plan.kernels[i].method in SPARSE_METHODS:
            node["kernel"]["cpu_text"] = node["kernel"]["text"]
            node["kernel"]["text"] = device_describe(op, plan.kernels[i])
        fill = decomp.details.get("output_fill", {}).get(op.output)
        if fill:  # its absent entries (plan/fills.py)
            node["fill"] = fill
        dense = decomp.details.get("densifies", {}).get(op.output)
        if dense is not None:  # dense where its sparse input is absent
            node["densifies"] = dense
        bal = decomp.details.get("balance", {}).get(op.output)
        if bal is not None:  # row slabs of equal nonzeros: each piece's nonzeros
            node["balance"] = dict(bal)
        est = decomp.details.get("output_nnz", {}).get(op.output)
        if est is not None:
            # the plan's output format by that estimate (plan.kernel.with_output)
            node["output_nnz"] = {"estimated": int(round(est)),
                                  "format": plan.kernels[i].out_format}
            got = getattr(result, "output_nnz", {}).get(op.output)
            ran = getattr(result, "ops", None) or ()
            if got is None and i < len(ran):  # an intermediate: its CSR tiles' entries
                got = getattr(ran[i], "out_nnz", None)
            if got is not None:
                node["output_nnz"]["measured"] = int(got)
        if c is not None:
            node["cost"] = {"join": c.join, "aggregation": c.aggregation, "retile": c.retile,
                            "overhead": c.overhead, "balance": c.balance,
                            **({"compute": c.compute} if c.compute else {}), "total": c.total,
                            "tile_bytes": c.tile_bytes}
        if mem is not None and op.output in mem.ops:  # the projection the Decomposition carries
            node["memory"] = {**mem.ops[op.output].as_dict(),
                              "may_spill": int(mem.may_spill.get(op.output, 0))}
        ch = choices.get(op.output)
        if ch is not None:
            node["search"] = {"cost": ch.cost, "candidates": ch.candidates}
            node["runner_ups"] = [{"pieces": dict(p), "cost": v} for p, v in ch.runner_ups]
        measured = getattr(result, "ops", None) or ()
        if i < len(measured):  # what the run returned for this operation (RunResult.ops)
            node["measured"] = measured[i].as_dict()
        nodes.append(node)
    per_worker = worker_flops(plan)
    mean = sum(per_worker) / len(per_worker) if per_worker else 0
    total: dict[str, Any] = {
        "flops": int(sum(n["flops"] for n in nodes)),
        "bytes_moved": int(moved),
        "cost": cost.total,
        "comm_bytes": cost.bytes,
        "peak_tile_bytes": cost.peak_tile_bytes,
        "kernel_calls": int(sum(n["kernel_calls"] for n in nodes)),
        "tasks": plan.task_count,
        "imbalance": (max(per_worker) / mean) if mean else 1.0,
    }
    if mem is not None:
        total["memory"] = mem.as_dict()
    out: dict[str, Any] = {"workers": plan.workers, "strategy": decomp.strategy, "nodes": nodes,
                           "total": total}
    if "target" in decomp.details:  # a cluster's own report: what the plan was made for
        out["target"] = dict(decomp.details["target"])
    if "search_seconds" in decomp.details:
        out["search_seconds"] = decomp.details["search_seconds"]
    if resident is not None:
        out["device_resident"] = {name: dict(r) for name, r in resident.items()}
    if "split_cost" in decomp.details:  # the search priced the BLAS threads (optimizer/threads.py)
        out["blas"] = {"threads": int(getattr(plan, "blas_threads", 0)),
                       "split_cost": decomp.details["split_cost"],
                       "one_call_cost": decomp.details.get("one_call_cost"),
                       "one_call_threads": decomp.details.get("one_call_threads")}
    if result is not None:
        out["measured"] = {"seconds": getattr(result, "seconds", None),
                           "bytes_moved": getattr(result, "bytes_moved", None),
                           "peak_bytes": getattr(result, "peak_bytes", None),
                           "kernel_calls": getattr(result, "kernel_calls", None),
                           "spilled_bytes": getattr(result, "spilled_bytes", 0),
                           "spill_seconds": getattr(result, "spill_seconds", 0.0),
                           "over_budget": getattr(result, "over_budget", 0),
                           "memory_limit": getattr(result, "memory_limit", None)}
        if getattr(result, "copies", None):
            out["measured"]["copies"] = dict(result.copies)
        if getattr(result, "op_copies", None):  # per operation, by the name it computes
            out["measured"]["op_copies"] = {n: dict(c) for n, c in result.op_copies.items()}
    return out


def render(decomp, plan, format: str = "text", result=None, resident=None,
           device: bool = False) -> str:
    """Render a planned (and, with ``result``, executed) TilePlan; ``device``: for a GPU
    executor (``plan_summary``)."""
    check_format(format)
    data = plan_summary(decomp, plan, result, resident, device)
    if format == "json":
        return json.dumps(data, indent=2, default=float)
    if format == "dot":
        return _dot(data, plan)
    if format == "svg":
        return dot_svg(_dot(data, plan))
    return Explanation(_text(data), data, _dot(data, plan))


# -- text ----------------------------------------------------------------------------------------

def count(n: float | None) -> str:
    """A count in three significant digits: ``count(1234567) == '1.23M'``.

    >>> count(999), count(1234567), count(2.5e10)
    ('999', '1.23M', '25.0G')
    """
    if n is None:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.3g}{unit}" if v >= 100 else f"{v:.2f}{unit}" if v < 10 else f"{v:.1f}{unit}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.3g}"


def _pieces(node: Mapping, pieces: Mapping[str, int]) -> str:
    # a label repeated in the output (a diagonal write) has one count of pieces
    outs = " ".join(f"{l}={pieces.get(l, 1)}" for l in dict.fromkeys(node["out_labels"]))
    aggs = " ".join(f"{l}={pieces.get(l, 1)}" for l in node["aggregated_labels"])
    return f"{outs} | {aggs}" if aggs else outs or "-"


def _tile(node: Mapping) -> str:
    t = node["tile_shape"]
    outs = "x".join(str(t[l]) for l in node["out_labels"]) or "1"
    aggs = "x".join(str(t[l]) for l in node["aggregated_labels"])
    return f"{outs} | {aggs}" if aggs else outs


def _delta(x: float) -> str:
    """A relative cost difference: ``+1.4%``, ``+76%``, ``-0.5%``, ``x3.2``."""
    if x >= 9.5:
        return f"x{x + 1:.1f}"
    pct = 100 * x
    return f"{pct:+.1f}%" if abs(pct) < 10 else f"{pct:+.0f}%"


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _fill(v: float) -> str:
    return "+inf" if v == math.inf else "-inf" if v == -math.inf else f"{v:g}"


def header(data: Mapping) -> list[str]:
    """The lines above the table: operations and workers, totals, and what was measured."""
    t = data["total"]
    analyze = "measured" in data
    lines = [f"EXPLAIN{' ANALYZE' if analyze else ''}: {len(data['nodes'])} operation(s) on "
             f"{data['workers']} worker(s), strategy {data['strategy']}"
             + (f" (search {_seconds(data['search_seconds'])})" if "search_seconds" in data else "")]
    if "target" in data:
        lines.append(target_line(data["target"]))
    lines.append(f"  total: {count(t['flops'])} flops, {t['kernel_calls']} kernel calls, "
                 f"{format_bytes(t['bytes_moved'])} moved between workers, "
                 f"cost {format_bytes(t['cost'])} (communication {format_bytes(t['comm_bytes'])}), "
                 f"peak tile memory {format_bytes(t['peak_tile_bytes'])} (largest kernel call), "
                 f"flop imbalance {t['imbalance']:.2f}")
    if "memory" in t:
        lines.append(memory_line(t["memory"]))
    sparse = {i["tensor"]: i for n in data["nodes"] for i in n.get("inputs", ())
              if i.get("format", "dense") != "dense"}
    if sparse:
        lines.append("  sparse inputs: " + ", ".join(
            f"{name} {i['format']} nnz {count(i['nnz'])} ({format_bytes(i['bytes'])})"
            for name, i in sparse.items()))
    fills = [f"{name} {_fill(i['fill'])}" for name, i in sparse.items() if "fill" in i] + \
        [f"{n['output']} {_fill(n['fill'])} (kept)" for n in data["nodes"] if "fill" in n]
    if fills:
        lines.append("  fill values: " + ", ".join(fills))
    dense = [f"{n['output']} (its value where the input is absent is {_fill(n['densifies'])})"
             for n in data["nodes"] if "densifies" in n]
    if dense:
        lines.append("  densifies: " + ", ".join(dense))
    nnz = [(n["output"], n["output_nnz"]) for n in data["nodes"] if "output_nnz" in n]
    if nnz:
        lines.append("  output nnz: " + ", ".join(
            f"{name} estimated {count(v['estimated'])}"
            + (f", measured {count(v['measured'])}" if "measured" in v else "")
            + (f" ({v['format']} tiles from the kernel)" if v.get("format", "dense") != "dense"
               else "")
            for name, v in nnz))
    bal = [(n["output"], n["balance"]) for n in data["nodes"] if "balance" in n]
    if bal:
        lines.append("  balance: " + "; ".join(
            f"{name}: {b['label']} cut by {b['tensor']}'s nonzeros, pieces of "
            + ", ".join(count(x) for x in b["nnz"]) + " (even cuts: "
            + ", ".join(count(x) for x in b["even_nnz"]) + ")" for name, b in bal))
    if "blas" in data:
        lines.append(blas_line(data["blas"]))
    if "device_resident" in data:
        lines.append(resident_line(data["device_resident"]))
    if analyze:
        m = data["measured"]
        limit = m.get("memory_limit")
        budget = f" of the {format_bytes(limit)} budget" if limit else ""
        lines.append(f"  measured: {_seconds(m['seconds'])}, {format_bytes(m['bytes_moved'])} moved, "
                     f"peak tile memory {format_bytes(m['peak_bytes'])} (tiles alive at once"
                     f"{budget}), spilled {format_bytes(m.get('spilled_bytes', 0))} in "
                     f"{_seconds(m.get('spill_seconds', 0.0))}"
                     + (f", {m['over_budget']} task(s) over the budget" if m.get("over_budget")
                        else ""))
        if m.get("copies"):
            lines.append(copies_line(m["copies"]))
        if m.get("op_copies"):
            lines.append(op_copies_line(m["op_copies"]))
    return lines


def target_line(t: Mapping) -> str:
    """``target: dask, 2 workers x 2 threads (4 plan workers), 1.5 GiB of tiles per worker``:
    what a cluster's workers reported and the plan was made for (driver/engine.py)."""
    per = t.get("memory_per_worker")
    mem = f"{format_bytes(per)} of tiles per worker (the smallest worker's limit)" \
        if per else "no memory limit per worker"
    return (f"  target: {t['executor']}, {t['workers']} worker{'s' if t['workers'] != 1 else ''}"
            f" x {t['threads']} thread{'s' if t['threads'] != 1 else ''} "
            f"({t['plan_workers']} plan worker{'s' if t['plan_workers'] != 1 else ''}), {mem}")


def resident_line(resident: Mapping) -> str:
    """Which stored inputs' tiles are on the devices already (the GPU executor's cache)."""
    parts = []
    for name, r in resident.items():
        part = f"{name} {r['resident']}/{r['loads']} tiles ({format_bytes(r['bytes'])})"
        if r.get("peer"):
            part += f", {r['peer']} on another device"
        parts.append(part)
    return "  device-resident inputs: " + ("; ".join(parts) if parts else "none read")


def copies_line(c: Mapping) -> str:
    """What a GPU run copied: host -> device, device -> host, between devices, and how its
    Loads fared with the device cache."""
    line = (f"  copied: {format_bytes(c.get('host_to_device', 0))} host->device, "
            f"{format_bytes(c.get('device_to_host', 0))} device->host, "
            f"{format_bytes(c.get('peer', 0))} between devices")
    if "cached_tiles" in c:
        line += (f"; device cache: {c.get('hits', 0)} hit(s), {c.get('peer_hits', 0)} from "
                 f"another device, {c.get('misses', 0)} miss(es), now "
                 f"{c['cached_tiles']} tiles ({format_bytes(c['cached_bytes'])})")
    if c.get("let_hits") or c.get("let_tiles_kept"):
        line += (f"; {c.get('let_hits', 0)} LET tile(s) read on the device"
                 + (f" ({c['let_assembled']} cut from tiles of another box)"
                    if c.get("let_assembled") else "")
                 + f", {c.get('let_tiles_kept', 0)} kept")
    return line


def op_copies_line(per_op: Mapping) -> str:
    """The bytes a GPU run copied per operation: its Loads' host -> device and between devices,
    its stored output's device -> host (``Y: 256 B device->host``)."""
    names = {"host_to_device": "host->device", "device_to_host": "device->host",
             "peer": "between devices"}
    parts = [f"{op}: " + ", ".join(f"{format_bytes(c[k])} {v}" for k, v in names.items()
                                   if c.get(k))
             for op, c in per_op.items() if any(c.get(k) for k in names)]
    return "  copied per operation: " + ("; ".join(parts) if parts else "nothing")


def blas_line(b: Mapping) -> str:
    """The BLAS threads the plan records (optimizer/threads.py): ``blas threads: 2, one call per
    BLAS operation (cost 64.0 MiB; split 96.0 MiB)``; ``blas threads: the executor's, split
    (cost 512.1 MiB; one call with 2 threads 1.0 GiB)``; or ``blas threads: the executor's (no
    one-call plan offered)``."""
    one = b.get("one_call_cost")
    if b["threads"]:
        return (f"  blas threads: {b['threads']}, one call per BLAS operation (cost "
                f"{format_bytes(one)}; split {format_bytes(b['split_cost'])})")
    if one is None:
        return "  blas threads: the executor's (no one-call plan offered)"
    return (f"  blas threads: the executor's, split (cost {format_bytes(b['split_cost'])}; one "
            f"call with {b['one_call_threads']} threads {format_bytes(one)})")


def memory_line(m: Mapping) -> str:
    """``memory: projected peak 61.0 MiB per worker of 64.0 MiB (memory_limit 128.0 MiB / 2
    workers)``, and the intermediates that may spill."""
    if m["budget"] is None:
        line = f"  memory: projected peak {format_bytes(m['peak'])} per worker (no memory_limit)"
    else:
        line = (f"  memory: projected peak {format_bytes(m['peak'])} per worker of "
                f"{format_bytes(m['budget'])} (memory_limit {format_bytes(m['memory_limit'])} / "
                f"{m['workers']} worker{'s' if m['workers'] != 1 else ''})"
                + ("" if m["fits"] else ": over budget"))
    if m.get("spill_peak"):
        line += f", intermediates up to {format_bytes(m['spill_peak'])} (may spill)"
    return line


# Columns shown right-aligned (numbers), by position in ``table``'s header.
RIGHT = frozenset({0, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16})


def table(data: Mapping) -> tuple[list[str], list[tuple[list[str], str | None]]]:
    """The operation table: its header, and per operation its cells and the runner-ups line
    (None when the search considered no other tiling). The text and HTML forms both print it."""
    analyze = "measured" in data
    head = ["#", "operation", "pieces", "tile", "calls", "fan-in", "flops", "moved", "cost", "peak",
            "kernel"]
    if analyze:
        head += ["time", "calls*", "moved*", "peak*", "live*", "spilled*"]
    rows = []
    for i, n in enumerate(data["nodes"], 1):
        row = [str(i), n["expression"], _pieces(n, n["pieces"]), _tile(n), str(n["kernel_calls"]),
               _fan_in(n), count(n["flops"]), format_bytes(n["bytes_moved"]),
               format_bytes(n["cost"]["total"]) if "cost" in n else "-",
               format_bytes(n["memory"]["total"]) if "memory" in n else "-", n["kernel"]["text"]]
        if analyze:
            m = n.get("measured", {})
            row += [_seconds(m.get("seconds")), str(m.get("kernel_calls", "-")),
                    format_bytes(m.get("bytes_moved")) if "bytes_moved" in m else "-",
                    format_bytes(m.get("peak_tile_bytes")) if "peak_tile_bytes" in m else "-",
                    format_bytes(m.get("peak_bytes")) if "peak_bytes" in m else "-",
                    format_bytes(m.get("spilled_bytes")) if "spilled_bytes" in m else "-"]
        ups = n.get("runner_ups")
        alts = None
        if ups:
            base = n["search"]["cost"] or 1.0
            alts = "runner-ups: " + ", ".join(
                f"{_pieces(n, u['pieces'])} ({_delta(u['cost'] / base - 1)})" for u in ups)
        rows.append((row, alts))
    return head, rows


def _fan_in(node: Mapping) -> str:
    """The fan-in cell, with the levels when aggregations are trees (``8 (2 levels)``: at most 8
    partials per aggregation task, in trees 2 tasks deep)."""
    levels = node.get("aggregation_levels", 0)
    return f"{node['fan_in']} ({levels} levels)" if levels > 1 else str(node["fan_in"])


MEASURED_NOTE = "* measured while running; the other columns are estimates"


def _text(data: Mapping) -> str:
    lines = header(data)
    head, rows = table(data)
    widths = [max(len(head[c]), *(len(r[c]) for r, _ in rows)) for c in range(len(head))]

    def fmt(cells):
        return "  " + "  ".join(c.rjust(w) if k in RIGHT else c.ljust(w)
                                for k, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines += ["", fmt(head), "  " + "  ".join("-" * w for w in widths)]
    for row, alts in rows:
        lines.append(fmt(row))
        if alts:
            lines.append(f"  {'':>{widths[0]}}  {alts}")
    if "measured" in data:
        lines.append("")
        lines.append("  " + MEASURED_NOTE)
    return "\n".join(lines)


# -- dot -----------------------------------------------------------------------------------------

def _dot(data: Mapping, plan) -> str:
    produced = {n["output"] for n in data["nodes"]}
    out = ["digraph plan {", "  rankdir=LR;", "  node [shape=box, fontname=monospace];"]
    stored = []
    for op in plan.ops:
        for o in op.inputs:
            if o.tensor not in produced and o.tensor not in stored:
                stored.append(o.tensor)
    for name in stored:
        out.append(f'  "{name}" [shape=cylinder];')
    for n, op in zip(data["nodes"], plan.ops):
        label = f"{n['expression']}\\n{_pieces(n, n['pieces'])}\\n{n['kernel_calls']} calls"
        out.append(f'  "{n["output"]}" [label="{_esc(label)}"];')
        for o in op.inputs:
            out.append(f'  "{o.tensor}" -> "{n["output"]}";')
    out.append("}")
    return "\n".join(out)


def _esc(s: str) -> str:
    return s.replace('"', '\\"')


# -- HTML (a notebook) ----------------------------------------------------------------------------

def explain_html(data: Mapping) -> str:
    """EXPLAIN's plan (``plan_summary``'s data) as its header lines and a table, one row
    per operation and a row of runner-ups under it."""
    head, rows = table(data)
    out = ['<div class="tensordb-explain">',
           '<pre class="header">' + escape("\n".join(line.strip() for line in header(data))) + "</pre>",
           '<table class="tensordb"><thead><tr>']
    out += [f"<th>{escape(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for cells, alts in rows:
        out.append('<tr class="operation">' + "".join(
            f'<td style="text-align:{"right" if k in RIGHT else "left"}">{escape(c)}</td>'
            for k, c in enumerate(cells)) + "</tr>")
        if alts:
            out.append(f'<tr class="runner-ups"><td></td><td colspan="{len(head) - 1}">'
                       f"{escape(alts)}</td></tr>")
    out.append("</tbody></table>")
    if "measured" in data:
        out.append(f'<p class="note">{escape(MEASURED_NOTE)}</p>')
    out.append("</div>")
    return "".join(out)
