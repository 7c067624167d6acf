"""The launch plan and the checks before anything starts (no processes are started here)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from distgnn.launch import env as E
from distgnn.launch.cli import options_from_args, parse_args
from distgnn.launch.ip_config import Machine
from distgnn.launch.plan import (
    LaunchError,
    LaunchOptions,
    build_plan,
    parse_extra_env,
    python_of,
    remote_shell_command,
    wrapper_argv,
)
from distgnn.launch.preflight import check_port_ranges, read_machines

MACHINES = [Machine("10.1.0.1", 30050), Machine("10.1.0.2", 30050), Machine("10.1.0.3", 31000)]


def options(**kw) -> LaunchOptions:
    base = dict(
        ip_config="/ws/ip.txt",
        part_config="/ws/g.json",
        command=("/venv/bin/python", "train.py", "--epochs", "3"),
        num_trainers=2,
        num_servers=2,
        num_samplers=1,
        workspace="/ws",
        extra_env=(("OMP_NUM_THREADS", "4"),),
    )
    base.update(kw)
    return LaunchOptions(**base)


def test_plan_servers_first_then_one_torchrun_agent_per_machine():
    plan = build_plan(MACHINES, options(), "jtest", 29400)
    assert [(p.machine_id, p.role, p.index) for p in plan] == [
        (0, "server", 0), (0, "server", 1), (1, "server", 0), (1, "server", 1), (2, "server", 0), (2, "server", 1),
        (0, "trainer", 0), (1, "trainer", 1), (2, "trainer", 2),
    ]  # fmt: skip
    assert [p.host for p in plan if p.role == "trainer"] == [m.ip for m in MACHINES]
    assert plan[0].argv == ("/venv/bin/python", "-m", "distgnn.server")
    assert [p.label for p in plan[:2]] == ["0/server/0", "0/server/1"]


def test_plan_environment_is_what_jobconfig_reads():

    plan = build_plan(MACHINES, options(), "jtest", 29400)
    server = plan[3]  # machine 1, server 1
    assert server.env[E.ROLE] == "server" and server.env[E.SERVER_ID] == "1" and server.env[E.MACHINE_ID] == "1"
    trainer = plan[-1]
    assert trainer.env[E.ROLE] == "trainer" and trainer.env[E.MACHINE_ID] == "2"
    for spec in plan:
        assert spec.env[E.JOB_ID] == "jtest"
        assert spec.env[E.NUM_SERVERS] == "2" and spec.env[E.NUM_TRAINERS] == "2" and spec.env[E.NUM_SAMPLERS] == "1"
        assert spec.env[E.IP_CONFIG] == "/ws/ip.txt" and spec.env[E.PART_CONFIG] == "/ws/g.json"
        assert spec.env["OMP_NUM_THREADS"] == "4"
        assert E.TOKEN not in spec.env  # the token travels on stdin only


def test_jobconfig_rebuilds_from_a_planned_environment(tmp_path):
    from distgnn.config import JobConfig

    ip = tmp_path / "ip.txt"
    ip.write_text("\n".join(f"{m.ip} {m.port}" for m in MACHINES) + "\n")
    plan = build_plan(MACHINES, options(ip_config=str(ip)), "jtest", 29400)
    config = JobConfig.from_env({**plan[3].env, E.TOKEN: "secret"})
    assert (config.role, config.machine_id, config.server_id, config.num_servers) == ("server", 1, 1, 2)
    assert config.server_address(1, 1) == ("10.1.0.2", 30051)


def test_torchrun_arguments():
    plan = build_plan(MACHINES, options(), "jtest", 29400)
    agent = plan[-2]  # machine 1
    argv = list(agent.argv)
    assert argv[:3] == ["/venv/bin/python", "-m", "torch.distributed.run"]
    assert "--nnodes=3" in argv and "--node-rank=1" in argv and "--nproc-per-node=2" in argv
    assert "--master-addr=10.1.0.1" in argv and "--master-port=29400" in argv
    assert argv[-3:] == ["train.py", "--epochs", "3"]
    module = build_plan(MACHINES, options(command=("python3", "-m", "pkg.train", "-x")), "j", 1)[-1]
    assert list(module.argv[-3:]) == ["-m", "pkg.train", "-x"] and module.argv[0] == "python3"
    script = build_plan(MACHINES, options(command=("./run.sh", "a")), "j", 1)[-1]
    assert list(script.argv[-3:]) == ["--no-python", "./run.sh", "a"] and script.argv[0] == "python3"


def test_gloo_binds_to_the_interface_holding_the_ip_config_address():
    plan = build_plan(MACHINES, options(), "j", 1, interfaces=("eth0", None, "ib0"))
    trainers = [p for p in plan if p.role == "trainer"]
    assert [t.env.get("GLOO_SOCKET_IFNAME") for t in trainers] == ["eth0", None, "ib0"]
    assert all("GLOO_SOCKET_IFNAME" not in p.env for p in plan if p.role == "server")
    chosen = build_plan(MACHINES, options(extra_env=(("GLOO_SOCKET_IFNAME", "bond0"),)), "j", 1, ("eth0",) * 3)
    assert {p.env["GLOO_SOCKET_IFNAME"] for p in chosen} == {"bond0"}  # the user's choice wins


def test_python_of_the_command():
    assert python_of(("/opt/venv/bin/python3.11", "t.py")) == "/opt/venv/bin/python3.11"
    assert python_of(("python", "t.py")) == "python"
    assert python_of(("bash", "t.sh")) == "python3"


def test_wrapper_and_remote_shell_line_quote_everything():
    spec = build_plan(MACHINES, options(command=("python", "train.py", "it's", "a b")), "jtest", 1)[-1]
    line = remote_shell_command("/w s", {"A": "x y", "B": "$HOME"}, wrapper_argv(spec, "python", 5.0))
    words = shlex.split(line)
    assert words[:5] == ["cd", "/w s", "&&", "exec", "env"]
    assert words[5:7] == ["A=x y", "B=$HOME"]
    assert words[7:11] == ["python", "-m", "distgnn.launch.remote", "run"]
    assert words[-2:] == ["it's", "a b"]


@pytest.mark.parametrize(
    "items, message",
    [
        (["NOEQUALS"], "NAME=VALUE"),
        (["1X=2"], "NAME=VALUE"),
        (["DISTGNN_TOKEN=x"], "cannot set DISTGNN_TOKEN"),
        (["DISTGNN_MACHINE_ID=1"], "cannot set DISTGNN_MACHINE_ID"),
    ],
)
def test_extra_env_rejects(items, message):
    with pytest.raises(LaunchError, match=message):
        parse_extra_env(items)


def test_extra_env_passes_optional_job_settings():
    assert parse_extra_env(["DISTGNN_CURVE=1", "A=b=c"]) == (("DISTGNN_CURVE", "1"), ("A", "b=c"))


@pytest.mark.parametrize(
    "command, message",
    [([], "no training command"), (["python"], "names no script"), (["python", "-u", "t.py"], "interpreter option")],
)
def test_bad_training_commands(command, message):
    args, _ = parse_args(["--ip-config", "i", "--part-config", "p", "--num-trainers", "1"])
    with pytest.raises(LaunchError, match=message):
        options_from_args(args, command)


def test_cli_splits_at_double_dash():
    args, command = parse_args(["--ip-config", "i", "--part-config", "p", "--num-trainers", "1", "--extra-env",
                                "A=1", "B=2", "--local", "--", "python", "t.py", "--local"])  # fmt: skip
    assert command == ["python", "t.py", "--local"] and args.local and args.extra_env == ["A=1", "B=2"]


def write_job(tmp_path, ip_text: str, num_parts: int) -> LaunchOptions:
    (tmp_path / "ip.txt").write_text(ip_text)
    (tmp_path / "g.json").write_text(json.dumps({"num_parts": num_parts}))
    return options(ip_config=str(tmp_path / "ip.txt"), part_config=str(tmp_path / "g.json"), num_servers=1)


def test_bad_ip_config_line_names_it(tmp_path):
    opts = write_job(tmp_path, "10.0.0.1\n10.0.0.2 30050 extra\n", 2)
    with pytest.raises(LaunchError, match=r"ip.txt:2: expected 'IP \[PORT\]'"):
        read_machines(opts)


def test_partition_count_must_match(tmp_path):
    opts = write_job(tmp_path, "10.0.0.1\n10.0.0.2\n", 3)
    with pytest.raises(LaunchError, match="lists 2 machines but .* has 3 partitions"):
        read_machines(opts)


def test_partition_config_unreadable(tmp_path):
    opts = write_job(tmp_path, "10.0.0.1\n", 1)
    (tmp_path / "g.json").write_text("not json")
    with pytest.raises(LaunchError, match="is not JSON"):
        read_machines(opts)
    with pytest.raises(LaunchError, match="cannot read the partition config"):
        read_machines(options(ip_config=opts.ip_config, part_config=str(tmp_path / "missing.json")))


def test_local_needs_local_addresses(tmp_path):
    opts = write_job(tmp_path, "127.0.0.1 5000\n192.0.2.7 5000\n", 2)
    with pytest.raises(LaunchError, match="machine 1 .* is 192.0.2.7, which is not an address of this host"):
        read_machines(LaunchOptions(**{**opts.__dict__, "local": True}))


def test_port_ranges_of_machines_on_one_address_must_not_overlap():
    check_port_ranges([Machine("127.0.0.1", 5000), Machine("127.0.0.1", 5002)], num_servers=2)
    with pytest.raises(LaunchError, match="machines 0 and 1 are both 127.0.0.1"):
        check_port_ranges([Machine("127.0.0.1", 5000), Machine("127.0.0.1", 5001)], num_servers=2)


def test_launcher_imports_only_the_standard_library():
    code = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import distgnn.launch.cli, distgnn.launch.node, distgnn.launch.remote\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new = json.loads(result.stdout)
    assert "distgnn.launch.cli" in new
    foreign = [m for m in new if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "distgnn"]
    assert foreign == [], f"third-party modules imported by the launcher: {foreign}"
    ours = [m for m in new if m.startswith("distgnn.") and not m.startswith("distgnn.launch")]
    assert ours == [], f"distgnn modules outside distgnn.launch imported by the launcher: {ours}"
