"""A stand-in trainer for launcher tests: reports the environment it got, then acts on cue.

$FAKE_MODE: ``ok`` (finish, rank 0 then asks the fake servers to shut down),
``raise`` (rank $FAKE_RAISE_RANK raises, the others keep running), ``raise_alone`` (rank $FAKE_RAISE_RANK
raises after $FAKE_DELAY s, the others finish as in ``ok`` after $FAKE_OTHERS_DELAY s), ``sleep``
(run until stopped), ``crash_once`` (like ``raise`` on the first start, like
``ok`` once restarted: DISTGNN_RESTART_COUNT > 0). Prints one
``FAKE_TRAINER {json}`` line with what it saw.
"""

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

env = os.environ
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
fake_dir = Path(env["FAKE_DIR"])
(fake_dir / f"trainer-r{rank}.pid").write_text(str(os.getpid()))
Path(f"/dev/shm/distgnn-{env['DISTGNN_JOB_ID']}-p{env['DISTGNN_MACHINE_ID']}-fake-trainer-r{rank}").write_bytes(b"x")
token = env.get("DISTGNN_TOKEN", "")
token_in_argv = False
for pid in (name for name in os.listdir("/proc") if name.isdigit()):
    with contextlib.suppress(OSError):  # a process that exits meanwhile (ENOENT, ESRCH) holds no token
        token_in_argv |= bool(token) and token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
seen = {
    "rank": rank,
    "world_size": world,
    "local_rank": int(env["LOCAL_RANK"]),
    "master_addr": env["MASTER_ADDR"],
    "machine_id": int(env["DISTGNN_MACHINE_ID"]),
    "role": env["DISTGNN_ROLE"],
    "num_trainers": int(env["DISTGNN_NUM_TRAINERS"]),
    "num_servers": int(env["DISTGNN_NUM_SERVERS"]),
    "ip_config": env.get("DISTGNN_IP_CONFIG"),
    "part_config": env.get("DISTGNN_PART_CONFIG"),  # absent in a job without graph servers
    "job_id": env["DISTGNN_JOB_ID"],
    "token_sha": hashlib.sha256(token.encode()).hexdigest()[:16] if token else None,
    "token_in_argv": token_in_argv,
    "cwd": os.getcwd(),
    "host_addresses": subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split(),
    "args": sys.argv[1:],
    "restart_count": int(env["DISTGNN_RESTART_COUNT"]),
    "slurm_node": env.get("SLURMD_NODENAME"),
    "started_at": time.time(),
}
print("FAKE_TRAINER " + json.dumps(seen), flush=True)
mode = env.get("FAKE_MODE", "ok")
if mode == "crash_once":
    mode = "raise" if seen["restart_count"] == 0 else "ok"
if mode in ("raise", "raise_alone") and rank == int(env.get("FAKE_RAISE_RANK", "0")):
    time.sleep(float(env.get("FAKE_DELAY", "0")))
    raise RuntimeError(f"fake trainer {rank} fails on cue")
if mode == "raise_alone":  # the others finish as in "ok", FAKE_OTHERS_DELAY seconds later
    time.sleep(float(env.get("FAKE_OTHERS_DELAY", "0")))
if mode in ("raise", "sleep"):
    print("fake trainer running", flush=True)
    time.sleep(600)
# Like a real trainer, which talks to every server before it is done: wait until all of them are up.
servers = int(env["DISTGNN_NUM_SERVERS"]) * world // int(env["DISTGNN_NUM_TRAINERS"])
deadline = time.monotonic() + 60
while len(list(fake_dir.glob("ready-m*-s*"))) < servers and time.monotonic() < deadline:
    time.sleep(0.05)
(fake_dir / f"done-r{rank}").write_text("")
if rank == 0:
    while len(list(fake_dir.glob("done-r*"))) < world:
        time.sleep(0.05)
    (fake_dir / "shutdown").write_text("")
