"""The sql/ examples share a database as users share one: every script runs after every other
(and after itself) in one database and one session of the command line, and prints what it
prints in a fresh database; sql/train_mlp.sql prints its loss curve, not its weights."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tensordb import cli as tensordb_cli

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "sql").glob("*.sql"))
ENV = {**os.environ, "TENSORDB_DEBUG": "", "COLUMNS": "120",
       "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
MARK = "=== script "


def cli(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensordb", *map(str, args)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=600)


def in_process(db, script, capsys):
    """``tensordb DB -f SCRIPT`` in this process (cli.main): (status, stdout, stderr)."""
    capsys.readouterr()
    rc = tensordb_cli.main([str(db), "-f", str(script)])
    out, err = capsys.readouterr()
    return rc, out, err


def every_ordered_pair(n: int) -> list[int]:
    """A walk over 0..n-1 in which every ordered pair (a, b), a == b included, is consecutive
    once: an Euler circuit of the complete digraph with loops (Hierholzer)."""
    unused = {a: list(range(n)) for a in range(n)}
    stack, walk = [0], []
    while stack:
        a = stack[-1]
        if unused[a]:
            stack.append(unused[a].pop())
        else:
            walk.append(stack.pop())
    return walk[::-1]


def segments(out: str) -> list[tuple[str, str]]:
    """The output of a run cut at the marker rows printed before each script."""
    parts = re.split(rf"^next *\n─+ *\n{MARK}(\w+) *\n\(1 row\)$", out, flags=re.M)
    return [(parts[k], parts[k + 1]) for k in range(1, len(parts), 2)]


def comparable(name: str, text: str) -> str:
    """What a script prints that does not depend on what else the database holds: quickstart's
    SHOW TENSORS lists every tensor, and DESCRIBE names the tile file."""
    text = re.sub(r"[0-9.]+ (ms|s)\b", "<time>", text)  # EXPLAIN's planning time
    text = "\n".join(line.rstrip() for line in text.strip().splitlines())
    if name == "quickstart":
        text = text[text.index("EXPLAIN"):text.index("property")]
    return text


def test_walk_covers_every_ordered_pair():
    walk = every_ordered_pair(7)
    pairs = list(zip(walk, walk[1:]))
    assert len(pairs) == 49 and set(pairs) == {(a, b) for a in range(7) for b in range(7)}


def test_every_script_runs_after_every_other_in_one_database(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert len(SCRIPTS) >= 7
    fresh = {}
    for script in SCRIPTS:  # the oracle: each script alone, in a database of its own
        rc, out, err = in_process(tmp_path / f"{script.stem}.tdb", script, capsys)
        assert rc == 0 and err == "", (script.stem, err)
        fresh[script.stem] = out
    walk = [SCRIPTS[k] for k in every_ordered_pair(len(SCRIPTS))]
    args = []
    for script in walk:
        args += ["-c", f"SELECT '{MARK}{script.stem}' AS next", "-f", script]
    done = cli(tmp_path / "shared.tdb", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    seen = segments(done.stdout)
    assert [name for name, _ in seen] == [s.stem for s in walk]
    for name, text in seen:
        assert comparable(name, text) == comparable(name, fresh[name]), name


def test_train_mlp_prints_its_loss_curve_only(tmp_path, capsys):
    rc, out, err = in_process(tmp_path / "t.tdb", ROOT / "sql" / "train_mlp.sql", capsys)
    assert rc == 0 and err == ""
    lines = out.strip().splitlines()
    steps = [int(m.group(1)) for m in (re.match(r"(\d+)\s+[0-9.]+$", ln.strip()) for ln in lines) if m]
    assert steps == [1, 5, 10, 15, 20]
    assert len(lines) <= 10, out  # the header, its rule, five rows, the count
    assert "W1" not in out and "[[" not in out
