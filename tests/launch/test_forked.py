"""distgnn.launch.forked: ranks forked from one process, watched, and stopped together.

Each case runs in a fresh interpreter (forking the test process, with its threads, is not what the module is
for): ranks write what they saw to files, the parent prints ``run()``'s code, ``failed`` and the signal.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import json, os, signal, sys, time
from pathlib import Path
from distgnn.launch.forked import ForkedRanks

out = Path(sys.argv[1])
case = sys.argv[2]

def main():
    rank = int(os.environ["RANK"])
    seen = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    seen["pgid_is_own"] = os.getpgid(0) == os.getpid()
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    if case in ("fail", "stubborn") and rank == 1:
        return 3
    if case == "raise" and rank == 0:
        raise RuntimeError("boom")
    if case == "stubborn" and rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if case in ("fail", "raise", "stubborn", "signal"):
        time.sleep(60)
    return 0

ranks = ForkedRanks(3, {"WORLD_SIZE": "3"}, main, grace_s=float(sys.argv[3]))
start = time.monotonic()
code = ranks.run()
print(json.dumps({"code": code, "failed": ranks.failed, "signal": ranks.signal_received,
                  "s": time.monotonic() - start, "left": [c.poll() is None for c in ranks.children.values()]}))
"""


def run_case(tmp_path: Path, case: str, grace_s: float = 5.0, signal_after_s: float | None = None) -> dict:
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), case, str(grace_s)], stdout=subprocess.PIPE, text=True
    )
    if signal_after_s is not None:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("rank*.json"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(signal_after_s)
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def seen(tmp_path: Path) -> list[dict]:
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]


def test_every_rank_runs_with_its_rank_in_its_own_process_group(tmp_path) -> None:
    result = run_case(tmp_path, "ok")
    assert (result["code"], result["failed"], result["signal"]) == (0, None, None)
    assert seen(tmp_path) == [
        {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "3", "pgid_is_own": True} for r in range(3)
    ]


def test_a_failed_rank_is_named_and_stops_the_others_at_once(tmp_path) -> None:
    result = run_case(tmp_path, "fail")
    assert (result["code"], result["failed"], result["signal"]) == (3, 1, None)
    assert result["s"] < 20 and not any(result["left"])  # the sleepers got SIGTERM, not their 60 s


def test_an_exception_in_a_rank_is_exit_code_1(tmp_path) -> None:
    result = run_case(tmp_path, "raise")
    assert (result["code"], result["failed"]) == (1, 0)


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace(tmp_path) -> None:
    result = run_case(tmp_path, "stubborn", grace_s=0.5)
    assert (result["code"], result["failed"]) == (3, 1)
    assert result["s"] < 20 and not any(result["left"])  # rank 0 ignored SIGTERM and sleeps 60 s: SIGKILL


def test_sigterm_to_the_parent_stops_every_rank(tmp_path) -> None:
    result = run_case(tmp_path, "signal", signal_after_s=0.2)
    assert (result["code"], result["failed"], result["signal"]) == (128 + signal.SIGTERM, None, signal.SIGTERM)
    assert result["s"] < 20 and not any(result["left"])
