"""``python -m distgnn.server``: run one graph server configured by the launcher's environment."""

from __future__ import annotations

import logging
import os
import sys

from distgnn.config import JobConfig
from distgnn.errors import DistGNNError
from distgnn.server.server import GraphServer


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        GraphServer(JobConfig.from_env(role="server")).run()
    except DistGNNError as exc:
        logging.getLogger("distgnn.server").error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    # Everything the server owns (shared memory, sockets, auth thread) is released by now. Skip the
    # interpreter's teardown: with large modules loaded it takes seconds, stalling every stop.
    os._exit(code)
