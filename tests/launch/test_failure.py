"""The failure report: which exit is the root cause, and how the report words it."""

from __future__ import annotations

from distgnn.launch.failure import (
    SIGNAL_PRECEDENCE_S,
    ProcessExit,
    failure_report,
    returncode_of_status,
    root_cause,
)


def exit_(role="trainer", machine=0, index=0, code=1, at=0.0, **kw) -> ProcessExit:
    return ProcessExit(role=role, machine_id=machine, index=index, returncode=code, observed_at=at, **kw)


def test_the_first_failure_is_the_root_cause():
    first = exit_(index=2, at=1.0)
    assert root_cause([exit_(index=0, at=3.0), first, exit_(index=1, at=2.0)]) is first


def test_a_death_by_signal_shortly_after_wins_over_an_earlier_error():
    killed = exit_("server", 1, 0, code=-9, at=1.0 + SIGNAL_PRECEDENCE_S / 2)
    assert root_cause([exit_(index=3, at=1.0), killed]) is killed


def test_a_death_by_signal_long_after_is_secondary():
    first = exit_(index=3, at=1.0)
    assert root_cause([first, exit_("server", 1, 0, code=-9, at=1.0 + 2 * SIGNAL_PRECEDENCE_S)]) is first


def test_processes_stopped_by_the_runner_or_ending_well_are_no_cause():
    assert root_cause([exit_(code=0), exit_(code=-15, stopped=True)]) is None
    assert failure_report([exit_(code=0)], "/runs/x") == []


def test_the_report_is_one_root_cause_line_then_one_summary_line():
    exits = [
        exit_("server", 1, 0, code=-9, at=1.0, pid=4242, last_stderr="serving partition 1"),
        exit_("trainer", 0, 0, code=1, at=1.5),
        exit_("trainer", 0, 1, code=1, at=1.6),
        exit_("trainer", 1, 3, code=1, at=1.7),
        exit_("server", 0, 0, code=-15, at=2.0, stopped=True),
    ]
    assert failure_report(exits, "/runs/j1") == [
        "error: server 0 of machine 1 (partition 1, pid 4242) was killed by SIGKILL; "
        "last stderr line: serving partition 1",
        "3 trainers exited afterwards (codes 1, 1, 1); 1 server was stopped; full logs in /runs/j1",
    ]


def test_a_lone_failure_says_so_and_long_lines_are_cut():
    (line, summary) = failure_report([exit_(code=2, host="10.0.0.2", last_stderr="x" * 1000)], None)
    assert line.startswith("error: trainer 0 of machine 0 (partition 0, host 10.0.0.2) exited with code 2; ")
    assert line.endswith("x...") and len(line) < 400
    assert summary == "no other process failed; no log directory was kept"


def test_shell_statuses_of_signal_deaths_become_negative():
    assert returncode_of_status(137) == -9
    assert returncode_of_status(1) == 1
    assert returncode_of_status(255) == 255
