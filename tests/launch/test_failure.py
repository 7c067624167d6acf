"""The failure report: which exit is the root cause, and how the report words it."""

from __future__ import annotations

from distgnn.launch.failure import (
    SIGNAL_PRECEDENCE_S,
    ProcessExit,
    failure_report,
    last_line_of,
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


def test_last_line_of_reads_the_end_of_a_log(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("".join(f"line {i}\n" for i in range(10_000)) + "\n  \n")
    assert last_line_of(log) == "line 9999"
    assert last_line_of(tmp_path / "missing.log") == ""


def test_exit_watch_names_a_killed_server_even_when_a_trainer_failed_first(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from distgnn.launch.failure import ExitWatch

    def start(code: str, log: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code], stderr=open(tmp_path / log, "w"))  # noqa: SIM115

    server = start("import sys, time; print('serving', file=sys.stderr, flush=True); time.sleep(60)", "s.log")
    failing = start("import sys; print('RpcError: boom', file=sys.stderr); sys.exit(1)", "t0.log")
    waiting = start("import time; time.sleep(60)", "t1.log")
    watch = ExitWatch()
    watch.add(server, "server", 1, 0, tmp_path / "s.log")
    watch.add(failing, "trainer", 0, 0, tmp_path / "t0.log")
    watch.add(waiting, "trainer", 0, 1, tmp_path / "t1.log")
    while not watch.failed():
        watch.poll()
        time.sleep(0.02)
    server.send_signal(signal.SIGKILL)  # observed after the trainer's error, within the precedence window
    cause = watch.settle()
    assert (cause.role, cause.machine_id, cause.returncode, cause.pid) == ("server", 1, -9, server.pid)
    watch.stopping()
    waiting.terminate()
    while not watch.all_ended():
        watch.poll()
        time.sleep(0.02)
    first, summary = watch.report_lines(tmp_path)
    assert (
        first
        == f"error: server 0 of machine 1 (partition 1, pid {server.pid}) was killed by SIGKILL; last stderr line: serving"
    )
    assert summary == f"1 trainer exited afterwards (codes 1); 1 trainer was stopped; full logs in {tmp_path}"
