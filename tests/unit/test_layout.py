"""The layout's import rules, read from the source (ast), and its size rule. ARCHITECTURE.md
says why each rule holds; this test keeps them, one package per part:

1. the core (``service/core``: the commit order and what it calls) imports ports, never an
   adapter, an operator command or the process plumbing that builds them (``worker``, ``cli``);
2. nothing outside ``service/devtools`` imports a dev tool (the image does not ship them;
   the runtime's command line, the worker and the adapters have no fault hooks);
3. the domain imports no I/O library, no metrics, no logging set-up, no adapter, no core;
4. the client libraries (asyncpg, confluent-kafka, redis) are imported by the adapters, by
   the operator commands (``service/ops``: one-shot commands that talk to the engines
   directly, their library errors turned into one line by ``cli``), by ``cli`` and by the
   dev tools, nowhere else: the worker reaches them only through the adapters;
5. no operator command is imported by the worker's path (core, adapters, worker);
6. no module is longer than 400 lines without saying why at its top.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
IO_LIBRARIES = {"asyncpg", "redis", "confluent_kafka", "prometheus_client", "structlog"}
CLIENT_LIBRARIES = {"asyncpg", "redis", "confluent_kafka"}
MAY_USE_CLIENTS = ("service.adapters", "service.ops", "service.cli", "service.devtools")
WORKER_PATH = ("service.core", "service.adapters", "service.worker")


def modules() -> dict[str, Path]:
    return {".".join(p.relative_to(SERVICE.parent).with_suffix("").parts): p
            for p in SERVICE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def broken(rule: str) -> list[str]:
    out = []
    for name, path in modules().items():
        for imported in imports(path):
            if _breaks(rule, name, imported):
                out.append(f"{name} imports {imported}")
    return sorted(out)


def _breaks(rule: str, module: str, imported: str) -> bool:
    if rule == "core":
        return module.startswith("service.core") and imported.startswith(
            ("service.adapters", "service.ops", "service.worker", "service.cli"))
    if rule == "devtools":
        return not module.startswith("service.devtools") and \
            imported.startswith("service.devtools")
    if rule == "domain":
        return module.startswith("service.domain") and (
            imported.split(".")[0] in IO_LIBRARIES
            or imported.startswith(("service.metrics", "service.logs", "service.adapters",
                                    "service.config", "service.core", "service.ops")))
    if rule == "clients":
        return imported.split(".")[0] in CLIENT_LIBRARIES and \
            not module.startswith(MAY_USE_CLIENTS)
    if rule == "ops":
        return module.startswith(WORKER_PATH) and imported.startswith("service.ops")
    raise AssertionError(rule)


def test_the_core_imports_ports_not_adapters() -> None:
    assert broken("core") == []


def test_nothing_outside_devtools_imports_a_dev_tool() -> None:
    assert broken("devtools") == []


def test_the_domain_imports_no_io_and_no_metrics() -> None:
    assert broken("domain") == []


def test_client_libraries_only_in_adapters_operator_commands_and_cli() -> None:
    assert broken("clients") == []


def test_the_worker_path_imports_no_operator_command() -> None:
    assert broken("ops") == []


def test_every_module_is_in_a_package_of_the_map() -> None:
    """The tree shows the architecture: a module at the top of ``service`` is process
    plumbing; everything else sits in the package of its part."""
    top = {p.stem for p in SERVICE.glob("*.py")}
    assert top == {"__init__", "__main__", "worker", "cli", "config", "logs", "metrics",
                   "health"}
    parts = {p.name for p in SERVICE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert parts == {"core", "ops", "adapters", "domain", "devtools"}


def test_the_rules_can_fail() -> None:
    """Each rule, fed an import that breaks it, says so (a rule that cannot fail is none)."""
    assert _breaks("core", "service.core.pipeline", "service.adapters.postgres")
    assert _breaks("devtools", "service.cli", "service.devtools.demo")
    assert _breaks("domain", "service.domain.messages", "structlog")
    assert _breaks("core", "service.core.plan", "service.ops.verify")
    assert _breaks("clients", "service.core.pipeline", "asyncpg")
    assert _breaks("clients", "service.worker", "confluent_kafka")
    assert _breaks("ops", "service.adapters.postgres", "service.ops.migrate")
    assert not _breaks("core", "service.core.pipeline", "service.core.ports")
    assert not _breaks("clients", "service.ops.purge", "asyncpg")


def test_no_module_over_400_lines_without_a_reason_at_its_top() -> None:
    long = []
    for name, path in modules().items():
        lines = path.read_text().splitlines()
        if len(lines) > 400 and not any("Over 400 lines:" in line for line in lines[:20]):
            long.append(f"{name}: {len(lines)} lines")
    assert long == []


def test_the_map_names_every_module_and_only_tests_that_exist() -> None:
    """ARCHITECTURE.md's parts table is how a newcomer finds a file: every module of
    ``service`` is named in it, and every test file it names exists."""
    import re

    root = SERVICE.parent
    text = (root / "ARCHITECTURE.md").read_text()
    unnamed = [name for name, path in modules().items()
               if path.name not in ("__init__.py", "__main__.py")
               and path.parent.parent.name != "devtools"  # bench/, chaos/: named as folders
               and path.name not in text]
    assert unnamed == []
    tiers = "unit|integration|e2e|deploy|secure|containers"
    named_tests = set(re.findall(rf"`((?:{tiers})/[\w/]*?test_\w+\.py)`", text))
    assert named_tests, "the map names no test"
    missing = sorted(t for t in named_tests if not (root / "tests" / t).exists())
    assert missing == []
