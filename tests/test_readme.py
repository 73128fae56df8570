"""The README works as written: its two set-up commands and both tours, each from a clean folder,
checked against numpy; and the docs cite only documents that exist."""
from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensordb

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def block(lang: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", README, re.S)
    assert len(blocks) == 1, f"the README has one {lang} tour"
    return blocks[0]


def setup_commands() -> list[str]:
    """The README's set-up commands: the indented lines that make a virtual environment."""
    commands = [line.strip() for line in README.splitlines()
                if line.startswith("    python3 -m venv .venv")]
    assert len(commands) == 2, "the README has two set-up commands"
    return commands


def clean_copy(dest: Path) -> Path:
    """The repository's files (tracked, and new files not ignored) in a fresh folder, as a clone
    would have them: no virtual environment, no databases, no caches."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"],
                            capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        for rel in listed.stdout.splitlines():
            src = ROOT / rel
            if src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
    else:  # not a git checkout: everything but what .gitignore names
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", "*.tdb", "*.egg-info", ".pytest_cache", ".hypothesis"))
    return dest


def cli(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """The command-line program, as a user runs it (its own entry point, in a subprocess).
    ``-m tensordb`` is what the ``tensordb`` script runs; ``test_console_script`` checks that."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tensordb", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_console_script_is_the_cli():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    scripts = cfg["options.entry_points"]["console_scripts"].strip()
    assert scripts == "tensordb = tensordb.cli:main"
    main = (ROOT / "tensordb" / "__main__.py").read_text()
    assert "from .cli import main" in main or "cli.main" in main
    assert "pytest" in cfg["options.extras_require"]["test"]  # the second command's extra


def test_quickstart_command_runs_in_a_clean_checkout(tmp_path):
    first = setup_commands()[0]
    run = first.split(" && ")[-1]
    assert run == ".venv/bin/tensordb quickstart.tdb -f sql/quickstart.sql"
    repo = clean_copy(tmp_path / "repo")
    done = cli(run.split()[1:], repo)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert (repo / "quickstart.tdb" / "catalog.duckdb").exists()
    with tensordb.connect(repo / "quickstart.tdb", read_only=True) as con:
        a, b, c = con.tensor("A"), con.tensor("B"), con.tensor("C")
        i, j = np.meshgrid(np.arange(512), np.arange(256), indexing="ij")
        np.testing.assert_allclose(a, np.sin(0.1 * i + 0.03 * j))
        np.testing.assert_allclose(c, a @ b, rtol=1e-10, atol=1e-10)


def test_sql_tour_runs_as_written(tmp_path):
    (tmp_path / "tour.sql").write_text(block("sql"))
    for attempt in range(2):  # OR REPLACE: it runs again on the same database
        done = cli(["tour.tdb", "-f", "tour.sql"], tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        with tensordb.connect(tmp_path / "tour.tdb", read_only=True) as con:
            a, b, m = con.tensor("A"), con.tensor("B"), con.tensor("M")
            np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-10)
            np.testing.assert_allclose(m, (a @ b).max(axis=1), rtol=1e-10)
            np.testing.assert_array_equal(con.tensor("M2"), m)
        # the SELECT printed the five largest row maxima, largest first
        # (the table's column widths follow the random values: find its header by its words)
        after = re.split(r"^i +value *$", done.stdout, maxsplit=1, flags=re.M)[1]
        top = [int(line.split()[0]) for line in after.splitlines()
               if re.match(r"\d+\s+\d", line)][:5]
        assert top == list(np.argsort(-m, kind="stable")[:5])
        assert "EXPLAIN: 1 operation(s)" in done.stdout


def test_python_tour_runs_twice_in_one_folder(tmp_path):
    script = tmp_path / "tour.py"
    script.write_text(block("python"))
    outputs = []
    for attempt in range(2):
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        outputs.append(done.stdout)
    out = outputs[0]
    assert out.count("\n") < 20, "the tour prints something short"
    assert "EXPLAIN: 1 operation(s)" in out and "E[i,k] = SUM(A[i,j] * B[j,k])" in out
    # the same seed: the second run prints the same results
    assert outputs[0].split("EXPLAIN")[0] == outputs[1].split("EXPLAIN")[0]
    with tensordb.connect(tmp_path / "w.tdb", read_only=True) as con:
        a, b, g = con.tensor("A"), np.load(tmp_path / "b.npy"), con.tensor("G")
        np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-10)
        np.testing.assert_allclose(con.tensor("D"), (g[:, :, None] + g[None, :, :]).min(axis=1))
        top = con.sql("SELECT i, k, value FROM C ORDER BY value DESC LIMIT 3").fetchall()
    c = a @ b
    order = np.argsort(-c, axis=None)[:3]
    assert [(i, k) for i, k, _ in top] == [tuple(int(x) for x in np.unravel_index(o, c.shape))
                                           for o in order]
    assert str(top) in out


def test_docs_cite_only_documents_in_the_repository():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for f in files:
        for name in re.findall(r"[\w./-]*\w\.md\b", f.read_text()):
            candidates = [ROOT / name, ROOT / "docs" / name, f.parent / name]
            assert any(c.exists() for c in candidates), f"{f.name} cites {name}, which is not here"


def test_readme_says_how_long_the_tests_take():
    assert re.search(r"about \d+ (seconds|minutes?)", README), "the README gives the test time"


@pytest.mark.slow
def test_setup_commands_from_a_fresh_clone(tmp_path):
    """Both set-up commands exactly as written, each in its own clean checkout: a new virtual
    environment, pip installing from the package index (minutes), then the quickstart and the
    whole test suite (the slow tests, this one included, stay skipped there)."""
    for k, command in enumerate(setup_commands()):
        repo = clean_copy(tmp_path / f"repo{k}")
        done = subprocess.run(["bash", "-c", command], cwd=repo, capture_output=True, text=True,
                              timeout=3600, env={k: v for k, v in os.environ.items()
                                                 if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        if k == 0:
            assert (repo / "quickstart.tdb" / "catalog.duckdb").exists()
        else:
            assert re.search(r"\d+ passed", done.stdout)
