"""The per-node entry for jobs started by an operator (torchrun, a Kubernetes PyTorchJob), not distgnn-launch.

Every worker process that torchrun starts runs this module instead of the
training script:

    torchrun --nnodes 2 --nproc-per-node 4 --node-rank $NODE_RANK \\
        --master-addr $MASTER_ADDR --master-port 29500 \\
        -m distgnn.launch.node --part-config /data/g.json -- train.py --epochs 3

Local rank 0 of each node (the node's leader) starts the node's graph servers
(children that die with it), learns every node's server address through a
small rendezvous beside torchrun's (node 0's leader listens on
``MASTER_PORT + 1``, or ``--rdzv-port``) unless ``--ip-config`` names a shared
file, and writes the ip_config for its node. Then every worker sets the
``DISTGNN_*`` environment that ``distgnn.initialize`` reads and runs the
training script in its own process (``runpy``), so torchrun sees the trainer's
exit status. When every trainer of the job is done (a second rendezvous
round), the leaders stop their servers; a node waiting in that round when node
0's leader stops or exits is told so within seconds (not at the deadline). A
server that dies during training makes its leader print the root-cause line and
exit 1, which torchrun then reports and acts on.

What reaches every node: the token in ``DISTGNN_TOKEN`` (a Kubernetes Secret;
never on a command line), the partition config path (``--part-config``, on a
shared volume or in the image), the job id (``DISTGNN_JOB_ID``, else derived
from torchrun's run id and ``MASTER_ADDR:MASTER_PORT``, the same on every
node). Standard library only.

With ``--num-servers 0`` (jobs whose trainers read their data themselves) no
node starts servers, there is no address exchange and no token is needed:
every worker runs the training script with torchrun's environment plus the
``DISTGNN_*`` job variables, without ``DISTGNN_IP_CONFIG`` and, unless
``--part-config`` is given, without ``DISTGNN_PART_CONFIG``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import runpy
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from distgnn.launch import env as E
from distgnn.launch.failure import ProcessExit, root_cause_line
from distgnn.launch.ip_config import DEFAULT_PORT, read_ip_config
from distgnn.launch.plan import LaunchError
from distgnn.launch.preflight import read_num_parts
from distgnn.launch.remote import remove_job_shm
from distgnn.launch.supervisor import die_with_parent, stop_processes

RENDEZVOUS_TIMEOUT_S = 300.0
# After the first round node 0's leader listens until every node has sent the last one: a refusal then means it
# has exited, retried this long only.
REFUSED_AFTER_START_S = 5.0
SERVER_STOP_GRACE_S = 5.0


class NodeError(Exception):
    """The node cannot join the job: missing environment, a failed rendezvous, a server that would not start."""


def torchrun_env(environ: dict[str, str]) -> dict[str, int | str]:
    """The topology torchrun (or a PyTorchJob) gives a worker; raises NodeError naming what is missing."""
    missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR") if k not in environ]
    node_rank = environ.get("GROUP_RANK", environ.get("NODE_RANK"))
    if missing or node_rank is None:
        raise NodeError(
            f"not started by torchrun: {', '.join(missing + ([] if node_rank else ['GROUP_RANK or NODE_RANK']))} "
            "missing from the environment (run: torchrun ... -m distgnn.launch.node ...)"
        )
    world, local_world = int(environ["WORLD_SIZE"]), int(environ["LOCAL_WORLD_SIZE"])
    if world % local_world:
        raise NodeError(f"WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {local_world}: nodes must match")
    return {
        "rank": int(environ["RANK"]),
        "local_rank": int(environ["LOCAL_RANK"]),
        "local_world": local_world,
        "num_nodes": world // local_world,
        "node_rank": int(node_rank),
        "master_addr": environ["MASTER_ADDR"],
        "master_port": int(environ.get("MASTER_PORT", "29500")),
    }


def job_id_of(environ: dict[str, str]) -> str:
    """``DISTGNN_JOB_ID``, else one derived from what every node of this torchrun job shares."""
    if environ.get(E.JOB_ID):
        return environ[E.JOB_ID]
    shared = f"{environ.get('TORCHELASTIC_RUN_ID', '')}|{environ['MASTER_ADDR']}|{environ.get('MASTER_PORT', '')}"
    return "t" + hashlib.sha256(shared.encode()).hexdigest()[:8]


def address_towards(host: str) -> str:
    """This node's address on the route to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))
        return s.getsockname()[0]


class RendezvousServer:
    """Node 0's leader: collects one JSON message per node and round, answers each with all of them."""

    def __init__(self, port: int, num_nodes: int, token: str) -> None:
        self.num_nodes = num_nodes
        self.token_sha = hashlib.sha256(token.encode()).hexdigest()
        self.sock = socket.create_server(("", port), reuse_port=False)
        self.rounds: dict[str, dict[int, tuple[socket.socket, object]]] = {}
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with contextlib.suppress(OSError, ValueError, KeyError):
                message = json.loads(conn.makefile().readline())
                if message["token_sha"] != self.token_sha:
                    conn.sendall(b'{"error": "wrong DISTGNN_TOKEN: every node needs the same token"}\n')
                    conn.close()
                    continue
                arrived = self.rounds.setdefault(message["round"], {})
                arrived[int(message["node"])] = (conn, message["value"])
                if len(arrived) == self.num_nodes:
                    answer = json.dumps({"values": [arrived[n][1] for n in sorted(arrived)]}).encode() + b"\n"
                    # Node 0 (this process's own leader) last: once it has its answer it may exit, and this
                    # daemon thread with it, so every other node's answer must be on its way by then.
                    for node in sorted(arrived, reverse=True):
                        with contextlib.suppress(OSError):
                            arrived[node][0].sendall(answer)
                            arrived[node][0].close()

    def close(self) -> None:
        """Stop listening (a node that connects later is refused) and hang up on the nodes waiting for a round's
        answer (they see the connection closed): neither waits for its deadline."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the serving thread (Linux)
        self.sock.close()
        for arrived in list(self.rounds.values()):
            for conn, _ in list(arrived.values()):
                with contextlib.suppress(OSError):
                    conn.close()


def exchange(
    host: str,
    port: int,
    token: str,
    round_name: str,
    node: int,
    value,
    timeout_s: float,
    refused_s: float | None = None,
) -> list:
    """Send this node's ``value`` for a round; returns every node's, in node order, once all have sent.

    A refused connection is retried until the deadline where node 0's leader may not listen yet (the first round,
    ``refused_s`` None); in a later round it means that leader has exited, so it is retried for ``refused_s``
    seconds only (a node whose peer failed stops in seconds, not at the deadline)."""
    deadline = time.monotonic() + timeout_s
    message = {"token_sha": hashlib.sha256(token.encode()).hexdigest(), "round": round_name, "node": node}
    payload = json.dumps({**message, "value": value}).encode() + b"\n"
    refused_since = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=5) as conn:
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                try:
                    conn.sendall(payload)
                    line = conn.makefile().readline()
                except (ConnectionResetError, BrokenPipeError):
                    line = ""
                if not line:
                    raise NodeError(
                        f"rendezvous '{round_name}' at {host}:{port}: node 0's leader closed the connection before "
                        "every node had arrived (it has exited or stopped: see node 0's log)"
                    )
                answer = json.loads(line)
                break
        except (TimeoutError, ConnectionRefusedError, json.JSONDecodeError) as exc:
            now = time.monotonic()
            if isinstance(exc, ConnectionRefusedError) and refused_s is not None:
                refused_since = now if refused_since is None else refused_since
                if now - refused_since > refused_s:
                    raise NodeError(
                        f"rendezvous '{round_name}' at {host}:{port}: refused for {refused_s:g} s after node 0's "
                        "leader had answered an earlier round: it has exited (see node 0's log)"
                    ) from None
            if now > deadline:
                raise NodeError(
                    f"rendezvous '{round_name}' at {host}:{port} did not complete within {timeout_s:g} s "
                    f"({exc.__class__.__name__}); are all nodes started, and is that port reachable?"
                ) from None
            time.sleep(0.2)
    if "error" in answer or "values" not in answer:
        raise NodeError(f"rendezvous '{round_name}' at {host}:{port} failed: {answer.get('error', answer)}")
    return answer["values"]


def wait_for_file(path: Path, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise NodeError(f"{what} ({path}) did not appear within {timeout_s:g} s; did local rank 0 fail?")
        time.sleep(0.05)


class Leader:
    """Local rank 0's duties: the node's servers and its side of the rendezvous."""

    def __init__(self, args: argparse.Namespace, topo: dict, job_id: str, token: str, ip_config: Path) -> None:
        self.args, self.topo, self.job_id, self.token, self.ip_config = args, topo, job_id, token, ip_config
        self.servers: list[subprocess.Popen] = []
        self.rdzv: RendezvousServer | None = None
        self.rdzv_port = args.rdzv_port or topo["master_port"] + 1
        self.stopping = False

    def start(self, env: dict[str, str]) -> None:
        remove_job_shm(self.job_id)  # left by an earlier start of this job (a restarted pod)
        if self.topo["node_rank"] == 0 and not self.args.ip_config:
            self.rdzv = RendezvousServer(self.rdzv_port, self.topo["num_nodes"], self.token)
        if self.args.ip_config:
            machines = read_ip_config(self.args.ip_config)
            lines = [f"{m.ip} {m.port}" for m in machines]
        else:
            me = [self.args.address or address_towards(self.topo["master_addr"]), self.args.port]
            lines = [f"{a} {p}" for a, p in self._exchange("addresses", me)]
        if len(lines) != self.topo["num_nodes"]:
            raise NodeError(f"the ip_config lists {len(lines)} machines but torchrun runs {self.topo['num_nodes']}")
        partial = self.ip_config.with_suffix(".partial")
        partial.write_text("\n".join(lines) + "\n")
        partial.rename(self.ip_config)  # the node's other workers wait for this name
        command = shlex.split(self.args.server_command) if self.args.server_command else None
        for server_id in range(self.args.num_servers):
            server_env = {**env, E.ROLE: "server", E.SERVER_ID: str(server_id)}
            argv = command or [sys.executable, "-m", "distgnn.server"]
            self.servers.append(subprocess.Popen(argv, env=server_env, preexec_fn=die_with_parent))
        threading.Thread(target=self._watch_servers, daemon=True).start()

    def _exchange(self, round_name: str, value, refused_s: float | None = None) -> list:
        host = self.topo["master_addr"]
        node = self.topo["node_rank"]
        return exchange(host, self.rdzv_port, self.token, round_name, node, value, self.args.timeout, refused_s)

    def _watch_servers(self) -> None:
        """A server that dies while the job runs is the root cause: say so and take this worker down."""
        while not self.stopping:
            for server_id, server in enumerate(self.servers):
                code = server.poll()
                if code not in (None, 0) and not self.stopping:
                    dead = ProcessExit("server", self.topo["node_rank"], server_id, code, time.monotonic(), server.pid)
                    print(f"distgnn node: {root_cause_line(dead)}", file=sys.stderr, flush=True)
                    self.stop()
                    os._exit(1)  # the trainer in this process may be blocked in a collective: no unwinding
            time.sleep(0.1)

    def finish(self, trainers_ok: bool) -> None:
        """After this node's trainers: wait for every node's (when all went well), then stop the servers."""
        try:
            if trainers_ok:
                wait = [
                    self.ip_config.with_name(f"{self.ip_config.stem}.done{r}") for r in range(self.topo["local_world"])
                ]
                for path in wait[1:]:
                    wait_for_file(path, self.args.timeout, "a local trainer's end")
                if not self.args.ip_config:
                    self._exchange("done", True, REFUSED_AFTER_START_S)
        finally:
            self.stop()

    def stop(self) -> None:
        self.stopping = True
        stop_processes(self.servers, SERVER_STOP_GRACE_S)
        remove_job_shm(self.job_id)
        for path in self.ip_config.parent.glob(f"{self.ip_config.stem}*"):
            path.unlink(missing_ok=True)
        if self.rdzv is not None:
            self.rdzv.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchrun ... -m distgnn.launch.node",
        usage="torchrun ... -m distgnn.launch.node [--part-config JSON | --num-servers 0] [options] "
        "-- SCRIPT|-m MODULE ARGS...",
        description="Per-node entry for operator-started jobs: local rank 0 starts the node's servers (docs/cluster.md).",
    )
    parser.add_argument("--part-config", default=os.environ.get(E.PART_CONFIG), help="the partition JSON")
    parser.add_argument("--ip-config", help="a shared ip_config (line i = node rank i); default: learned at start")
    parser.add_argument(
        "--num-servers", type=int, default=1, help="servers per node (default 1; 0: trainers only, no partition needed)"
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"first server port (default {DEFAULT_PORT})")
    parser.add_argument("--address", help="this node's address for the others (default: the route to MASTER_ADDR)")
    parser.add_argument("--rdzv-port", type=int, help="node 0's port for the address exchange (default MASTER_PORT+1)")
    parser.add_argument("--server-command", help="command that runs one server (default: PYTHON -m distgnn.server)")
    parser.add_argument("--timeout", type=float, default=RENDEZVOUS_TIMEOUT_S, help="seconds to wait for other nodes")
    return parser


def check_num_parts(part_config: str, num_nodes: int) -> None:
    """Node i holds partition i: the partition config must have one part per node."""
    try:
        num_parts = read_num_parts(part_config)
    except LaunchError as exc:
        raise NodeError(str(exc)) from None
    if num_parts != num_nodes:
        raise NodeError(
            f"{part_config} has {num_parts} partitions but torchrun runs {num_nodes} nodes; node i holds "
            "partition i, so the counts must match (re-partition or change --nnodes)"
        )


def run_trainer(command: list[str]) -> None:
    """Run the training script (or ``-m module``) in this process, as ``python SCRIPT ARGS`` would."""
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(command)
        sys.path.insert(0, os.path.dirname(os.path.abspath(command[0])))
        runpy.run_path(command[0], run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, command = build_parser().parse_args(argv[:cut]), argv[cut + 1 :]
    try:
        if not command:
            raise NodeError("no training command: put it after '--', e.g. -- train.py --epochs 3")
        if args.num_servers < 0:
            raise NodeError(f"--num-servers must be >= 0, got {args.num_servers}")
        if args.num_servers and not args.part_config:
            raise NodeError(
                f"no partition config: pass --part-config or set {E.PART_CONFIG} "
                "(or --num-servers 0 for trainers that read their data themselves)"
            )
        token = os.environ.get(E.TOKEN)
        if args.num_servers and not token:
            raise NodeError(f"{E.TOKEN} is not set: give every node the same secret token (a Kubernetes Secret)")
        topo = torchrun_env(dict(os.environ))
        if args.part_config:
            check_num_parts(args.part_config, topo["num_nodes"])
        job_id = job_id_of(dict(os.environ))
        ip_config = Path(f"/tmp/distgnn-{job_id}-m{topo['node_rank']}-ip_config.txt")
        env = {
            **os.environ,
            E.NUM_SERVERS: str(args.num_servers),
            E.NUM_TRAINERS: str(topo["local_world"]),
            E.MACHINE_ID: str(topo["node_rank"]),
            E.JOB_ID: job_id,
            E.SERVER_ID: "0",
        }
        if args.part_config:
            env[E.PART_CONFIG] = os.path.abspath(args.part_config)
        if args.num_servers:
            env[E.IP_CONFIG] = str(ip_config)
        env.setdefault(E.RESTART_COUNT, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        leader = None  # with --num-servers 0 there is nothing to start or wait for
        if args.num_servers and topo["local_rank"] == 0:
            leader = Leader(args, topo, job_id, token, ip_config)
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
            leader.start(env)
        elif args.num_servers:
            wait_for_file(ip_config, args.timeout, "the node's ip_config")
    except NodeError as exc:
        print(f"distgnn node: error: {exc}", file=sys.stderr, flush=True)
        return 2
    os.environ.update({**env, E.ROLE: "trainer"})
    ok = False
    try:
        run_trainer(command)
        ok = True
    except SystemExit as exc:
        ok = exc.code in (None, 0)
        raise
    finally:
        if leader is not None:
            leader.finish(ok)
        elif ok and args.num_servers:
            ip_config.with_name(f"{ip_config.stem}.done{topo['local_rank']}").write_text("")
        elif not args.num_servers and topo["local_rank"] == 0:
            remove_job_shm(job_id)  # no leader to sweep the job's shared memory on this machine
    return 0


if __name__ == "__main__":
    sys.exit(main())
