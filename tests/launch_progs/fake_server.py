"""A stand-in for ``python -m distgnn.server`` in launcher tests (no torch, no partition).

Records its pid in $FAKE_DIR, creates a shared-memory file named like the real
servers' ones, prints what it received, writes $FAKE_DIR/ready-m<M>-s<S>, and
exits 0 once a trainer writes $FAKE_DIR/shutdown (the real servers' shutdown
request). Killed, it leaves its shared-memory file behind for the launcher to
clean up.
"""

import os
import time
from pathlib import Path

machine, server = os.environ["DISTGNN_MACHINE_ID"], os.environ["DISTGNN_SERVER_ID"]
fake_dir = Path(os.environ["FAKE_DIR"])
(fake_dir / f"server-m{machine}-s{server}.pid").write_text(str(os.getpid()))
shm = Path(f"/dev/shm/distgnn-{os.environ['DISTGNN_JOB_ID']}-p{machine}-fake-s{server}")
shm.write_bytes(b"x")
role, token = os.environ["DISTGNN_ROLE"], os.environ.get("DISTGNN_TOKEN", "")
print(f"fake server ready machine={machine} server={server} role={role} token={'yes' if token else 'no'}", flush=True)
(fake_dir / f"ready-m{machine}-s{server}").write_text("")
while not (fake_dir / "shutdown").exists():
    time.sleep(0.05)
shm.unlink(missing_ok=True)  # a leader on the same host may have swept the job's segments first, as real servers allow
print("fake server shutting down", flush=True)
