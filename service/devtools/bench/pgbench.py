"""pgbench of the worker's own statement (``service.adapters.postgres.AUTHORIZE_STATEMENT``):
what the database alone can do with it, the ceiling the worker is held against.

``script(batch)`` writes the statement for ``batch`` authorizations a call on random
accounts of the benchmark's world, with pgbench variables in place of the bind parameters;
``tps(dsn, script, clients, seconds)`` runs it and returns calls per second.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from service.adapters import postgres as sql


def script(batch: int, accounts: int, statement: str = sql.AUTHORIZE_STATEMENT) -> str:
    """One call of the statement with ``batch`` authorizations of 1.00 EUR on accounts
    ``BA-00000`` … drawn at random (the columns are built by the server, as arrays joined
    into the texts the worker sends: a few µs a row)."""
    account = f"'BA-' || lpad(floor(random() * {accounts})::int::text, 5, '0')"
    return "\n".join(["\\set n random(1, 2000000000)",
                      _call(statement, batch, "pgb", account, "PURCHASE"), ""])


def cards_script(batch: int, accounts: int, statement: str = sql.AUTHORIZE_STATEMENT,
                 cards: str = "BP-") -> str:
    """One call of ``batch`` purchases of 1.00 EUR, each naming its account's card
    ``cards…`` (the pair's seed: ``BP-…`` without limits, ``BK-…`` with a daily and a monthly
    limit), on accounts ``BA-…`` drawn at random, as the benchmark's messages are (each
    message's number a hash of the call's and its own: its account and its card agree)."""
    number = f"lpad(((hashint4(:a + g) & 2147483647) % {accounts})::text, 5, '0')"
    return "\n".join(["\\set n random(1, 2000000000)",
                      f"\\set a random(0, {accounts - 1})",
                      _call(statement, batch, "pgk", f"'BA-' || {number}", "PURCHASE",
                            card=f"'{cards}' || {number}"),
                      ""])


def limits_script(batch: int, accounts: int, statement: str = sql.AUTHORIZE_STATEMENT) -> str:
    """``cards_script`` on the cards with a daily and a monthly limit each."""
    return cards_script(batch, accounts, statement, cards="BK-")


def lifecycle_script(batch: int, accounts: int,
                     statement: str = sql.AUTHORIZE_STATEMENT) -> str:
    """Two calls: ``batch`` AUTHORIZATIONs of 1.00 EUR, then a CLEARING of each (the
    lifecycle's common path: a hold placed, a hold ended and a ledger entry), on accounts
    ``BA-…`` in turn from a random one."""
    account = (f"'BA-' || lpad(((:a + g) % {accounts})::text, 5, '0')")
    return "\n".join(["\\set n random(1, 2000000000)",
                      f"\\set a random(0, {accounts - 1})",
                      _call(statement, batch, "pgh", account, "AUTHORIZATION"),
                      _call(statement, batch, "pgc", account, "CLEARING", original="pgh"),
                      ""])


def _call(statement: str, batch: int, prefix: str, account: str, kind: str,
          original: str | None = None, card: str | None = None) -> str:
    """The statement for ``batch`` messages of ``kind``, transaction ids ``prefix-…`` (and
    originals ``original-…`` of the same numbers), on ``account`` (an expression of g, the
    message's number), naming ``card`` (an expression of g; None: no card)."""
    rows = f"generate_series(1, {batch})"

    def ids(p: str) -> str:
        return f"ARRAY(SELECT '{p}-' || :client_id || '-' || :n || '-' || g FROM {rows} g)"

    arrays = {
        1: ids(prefix),
        2: f"ARRAY(SELECT {account} FROM {rows} g)",
        3: f"array_fill('1.00'::text, ARRAY[{batch}])",
        4: f"array_fill('EUR'::text, ARRAY[{batch}])",
        5: f"array_fill('{kind}'::text, ARRAY[{batch}])",
        6: f"array_fill('fp'::text, ARRAY[{batch}])",
        7: f"array_fill('corr'::text, ARRAY[{batch}])",
        8: f"array_fill('msg'::text, ARRAY[{batch}])",
        9: f"array_fill('0'::text, ARRAY[{batch}])",
        10: f"array_fill('0'::text, ARRAY[{batch}])",
        # the original_transaction_id each names (none: NULL)
        14: ids(original) if original else f"array_fill(NULL::text, ARRAY[{batch}])",
        15: f"array_fill(NULL::text, ARRAY[{batch}])",  # no conversion
        16: f"array_fill(NULL::text, ARRAY[{batch}])",
        17: f"array_fill('f'::text, ARRAY[{batch}])",  # no partial approval
        18: f"array_fill(NULL::text, ARRAY[{batch}])",  # (a clearing's final flag)
        19: (f"ARRAY(SELECT {card} FROM {rows} g)" if card
             else f"array_fill(NULL::text, ARRAY[{batch}])"),
        20: f"array_fill('5411'::text, ARRAY[{batch}])",
        21: f"array_fill(NULL::text, ARRAY[{batch}])",  # no merchant country
        22: f"array_fill(now()::text, ARRAY[{batch}])",
    }
    values = {number: f"array_to_string({array}, E'\\x1f', E'\\x1e')"
              for number, array in arrays.items()}
    values |= {11: "now()", 12: "'pgbench'", 13: "gen_random_uuid()", 23: "'UTC'"}
    for number in sorted(values, reverse=True):  # $23 before $2
        statement = statement.replace(f"${number}", values[number])
    return " ".join(statement.split()) + ";"


def tps(dsn: str, script_file: Path, *, clients: int, seconds: int) -> float:
    """Calls per second of the script, ``clients`` connections at once."""
    rest = dsn.split("://", 1)[1]
    hostport, db = rest.split("/", 1)
    user = hostport.split("@")[0] if "@" in hostport else None
    hostport = hostport.split("@")[-1]
    host, port = hostport.rsplit(":", 1) if ":" in hostport else (hostport, "5432")
    cmd = ["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
           "-T", str(seconds), "-f", str(script_file), "-h", host, "-p", port, db]
    if user:
        cmd += ["-U", user.split(":")[0]]
    # (The worker's sessions plan each execution for its own arrays and compile none:
    # adapters/postgres.py.)
    env = {**os.environ, "PGOPTIONS": "-c plan_cache_mode=force_custom_plan -c jit=off"}
    result = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    found = re.search(r"tps = ([\d.]+)", result.stdout)
    if found is None:
        raise RuntimeError(f"pgbench printed no tps:\n{result.stdout}\n{result.stderr}")
    return float(found.group(1))
