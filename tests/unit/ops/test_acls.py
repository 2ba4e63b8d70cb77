"""``payauth acls`` (``service/ops/acls.py``): the worker's minimal ACLs as printed, and its
flags. Creating them on a secured broker: tests/secure/test_secured_stack.py."""

from __future__ import annotations

import pytest

from tests.support.cli import refusal

pytestmark = pytest.mark.usefixtures("clean_payauth_env")


def test_acls_prints_the_workers_minimal_list(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from service import cli
    from service.cli import main

    # The command's logging set-up would bind the process's loggers to this test's captured
    # stdout, closed after it; the printed list is what this test reads.
    monkeypatch.setattr(cli, "configure_logging", lambda *args: None)
    for name, value in {"GROUP_ID": "cg", "INPUT_TOPIC": "in", "OUTPUT_TOPIC": "out",
                        "DLQ_TOPIC": "dlq"}.items():
        monkeypatch.setenv(f"PAYAUTH_{name}", value)
    assert main(["acls", "--principal", "User:worker"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "acls for User:worker as a worker of group cg: dry run (--execute to create)",
        "  ALLOW User:worker Read on topic in",
        "  ALLOW User:worker Read on group cg",
        "  ALLOW User:worker Write on topic out",
        "  ALLOW User:worker Write on topic dlq",
        "  ALLOW User:worker DescribeConfigs on topic dlq",
    ]


@pytest.mark.parametrize("principal", ["worker", "Group:worker", "User:"])
def test_a_principal_not_of_the_form_user_name_is_one_line(
        capsys: pytest.CaptureFixture[str], principal: str) -> None:
    line = refusal(capsys, "acls", "--principal", principal)
    assert line.startswith("payauth acls: ") and "--principal" in line and "User:NAME" in line


def test_no_principal_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--principal" in refusal(capsys, "acls")
