"""The layout's import rules, read from the source (ast), and its size rule. ARCHITECTURE.md
says why each rule holds; this test keeps them:

1. the core (the commit order and what it calls) imports ports, never an adapter;
2. nothing outside ``service/devtools`` imports a dev tool (the image does not ship them;
   the runtime's command line, the worker and the adapters have no fault hooks);
3. the domain imports no I/O library, no metrics, no logging set-up, no adapter;
4. no module is longer than 400 lines without saying why at its top.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
CORE = {"pipeline", "plan", "dispatcher", "accounting", "ports"}
IO_LIBRARIES = {"asyncpg", "redis", "confluent_kafka", "prometheus_client", "structlog"}


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
        return module.split(".")[-1] in CORE and module.count(".") == 1 and \
            imported.startswith("service.adapters")
    if rule == "devtools":
        return not module.startswith("service.devtools") and \
            imported.startswith("service.devtools")
    if rule == "domain":
        return module.startswith("service.domain") and (
            imported.split(".")[0] in IO_LIBRARIES
            or imported.startswith(("service.metrics", "service.logs", "service.adapters",
                                    "service.config")))
    raise AssertionError(rule)


def test_the_core_imports_ports_not_adapters() -> None:
    assert broken("core") == []


def test_nothing_outside_devtools_imports_a_dev_tool() -> None:
    assert broken("devtools") == []


def test_the_domain_imports_no_io_and_no_metrics() -> None:
    assert broken("domain") == []


def test_the_rules_can_fail() -> None:
    """Each rule, fed an import that breaks it, says so (a rule that cannot fail is none)."""
    assert _breaks("core", "service.pipeline", "service.adapters.postgres")
    assert _breaks("devtools", "service.cli", "service.devtools.demo")
    assert _breaks("domain", "service.domain.messages", "structlog")
    assert not _breaks("core", "service.pipeline", "service.ports")


def test_no_module_over_400_lines_without_a_reason_at_its_top() -> None:
    long = []
    for name, path in modules().items():
        lines = path.read_text().splitlines()
        if len(lines) > 400 and not any("Over 400 lines:" in line for line in lines[:20]):
            long.append(f"{name}: {len(lines)} lines")
    assert long == []
