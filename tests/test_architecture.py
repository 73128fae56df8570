"""The import rules of docs/architecture.md, checked mechanically: import-linter's contracts in
setup.cfg, run the way a developer runs them (`lint-imports`, in a subprocess), on this checkout and
on copies of it with a rule broken on purpose."""
from __future__ import annotations

import configparser
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tensordb

ROOT = Path(__file__).resolve().parent.parent
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"

pytest.importorskip("importlinter", reason="import-linter is in the test extra")


def lint(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the tensordb package under ``root`` with ``root``'s setup.cfg."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo", "setup.cfg"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def contracts() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def lines(value: str) -> set[str]:
    return {line.strip() for line in value.splitlines() if line.strip()}


def test_every_contract_is_kept():
    run = lint(ROOT)
    assert run.returncode == 0, f"import rules broken (docs/architecture.md):\n{run.stdout}{run.stderr}"
    count = sum(1 for s in contracts().sections() if s.startswith("importlinter:contract:"))
    assert f"Contracts: {count} kept, 0 broken." in run.stdout


def test_the_dialect_contract_forbids_every_module_but_errors():
    """'Only errors and its own modules': a module added to tensordb later is forbidden too."""
    forbidden = lines(contracts()["importlinter:contract:dialect"]["forbidden_modules"])
    children = {f"tensordb.{m.name}" for m in pkgutil.iter_modules(tensordb.__path__)}
    assert forbidden == children - {"tensordb.dialect", "tensordb.errors"}


def test_the_dialect_contract_ignores_nothing_and_the_docs_list_nothing_pending():
    """The dialect only parses: no import of it is excused, here or in the docs."""
    assert "ignore_imports" not in contracts()["importlinter:contract:dialect"]
    doc = (ROOT / "docs" / "architecture.md").read_text()
    rules = doc[doc.index("## Import rules"):doc.index("## Observability")]
    assert not re.findall(r"^\s+(tensordb\.dialect\S* -> \S+)", rules, re.M)


def test_the_binder_may_read_only_the_dialects_ast():
    """Every module of the dialect but ast.py is forbidden to the binder, one added later too."""
    import tensordb.dialect
    forbidden = lines(contracts()["importlinter:contract:bind"]["forbidden_modules"])
    dialect = {f"tensordb.dialect.{m.name}" for m in pkgutil.iter_modules(tensordb.dialect.__path__)}
    assert dialect - {"tensordb.dialect.ast"} <= forbidden
    assert "tensordb.dialect.ast" in dialect and "tensordb.dialect" not in forbidden


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "tensordb", tmp_path / "tensordb",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n\ndef _broken():\n    {line}\n")


def test_a_forbidden_import_inside_a_function_breaks_the_check(tmp_path):
    root = _copy(tmp_path)
    _append(root / "tensordb" / "storage" / "meta.py", "from ..plan import ir")
    run = lint(root)
    assert run.returncode != 0
    assert "storage imports no plan, optimizer, physical, exec or dialect BROKEN" in run.stdout
    assert "tensordb.storage.meta -> tensordb.plan.ir" in run.stdout


def test_an_import_cycle_breaks_the_check(tmp_path):
    """physical importing exec is not forbidden by itself; with exec importing physical it is a
    cycle."""
    root = _copy(tmp_path)
    _append(root / "tensordb" / "physical" / "lower.py", "from ..exec import tasks")
    run = lint(root)
    assert run.returncode != 0
    assert "no import cycles BROKEN" in run.stdout
    assert "- .physical -> .exec (1 import)" in run.stdout
    assert "BROKEN" not in run.stdout.replace("no import cycles BROKEN", "")


def test_an_ignored_import_that_went_away_breaks_the_check(tmp_path):
    """An excused import cannot go stale: an ignored import that no longer exists is an error."""
    root = _copy(tmp_path)
    cfg = (root / "setup.cfg").read_text()
    source = "source_modules =\n    tensordb.dialect\n"
    extra = "ignore_imports =\n    tensordb.dialect.lexer -> tensordb.storage\n"
    assert cfg.count(source) == 1
    (root / "setup.cfg").write_text(cfg.replace(source, source + extra))
    run = lint(root)
    assert run.returncode != 0
    assert "tensordb.dialect.lexer -> tensordb.storage" in run.stdout + run.stderr


def test_storage_reaching_up_into_the_sql_front_door_or_a_format_breaks_the_check(tmp_path):
    """storage keeps the catalog, payloads, readers, writers and integrity; the SQL front door
    and the file formats sit on it (formats -> sqlfront -> storage), never under it."""
    root = _copy(tmp_path)
    _append(root / "tensordb" / "storage" / "catalog.py", "from ..sqlfront import guard")
    _append(root / "tensordb" / "sqlfront" / "suggest.py", "from ..formats import filemeta")
    run = lint(root)
    assert run.returncode != 0
    assert "storage imports no sqlfront or formats, and sqlfront no formats BROKEN" in run.stdout
    assert "tensordb.storage.catalog -> tensordb.sqlfront.guard" in run.stdout
    assert "tensordb.sqlfront.suggest -> tensordb.formats.filemeta" in run.stdout


def test_a_format_importing_the_session_breaks_the_check(tmp_path):
    root = _copy(tmp_path)
    _append(root / "tensordb" / "formats" / "load.py", "from ..session import script")
    run = lint(root)
    assert run.returncode != 0
    assert "the file formats import no plan, optimizer, physical, exec, dialect, binder, " in run.stdout
    assert "tensordb.formats.load -> tensordb.session.script" in run.stdout


# A private name of storage read from outside it: its private modules (``storage._duck``) or a
# private attribute of a store (``store._lock``). What others need, storage names publicly
# (``Store.lock``, ``check_open``, ``in_transaction``, ``find``, ``views_of``, ``register_view``,
# ``query``; ``tensordb.storage.translating``, ``quote_ident``, ...).
_PRIVATE = re.compile(r"storage\._\w|\bstore\._\w|from \.+_duck\b")


def test_nothing_outside_storage_reads_its_private_names():
    package = ROOT / "tensordb"
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted(package.rglob("*.py")) if package / "storage" not in path.parents
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if _PRIVATE.search(line.split("#")[0])]
    assert found == []


def test_the_private_name_check_sees_what_it_is_meant_to():
    assert _PRIVATE.search("from ..storage._duck import quote_ident")
    assert _PRIVATE.search("with store._lock, translating():")
    assert _PRIVATE.search("meta = self._con.store._find(name)")
    assert not _PRIVATE.search("with store.lock, translating():")
    assert not _PRIVATE.search("from ..storage import quote_ident, translating")
