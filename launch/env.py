"""Names of the environment variables through which a job's configuration
reaches its processes. The launcher and LocalCluster write them;
``distgnn.initialize`` reads them once (``distgnn.config.JobConfig.from_env``).
"""

ROLE = "DISTGNN_ROLE"  # "server" or "trainer"
IP_CONFIG = "DISTGNN_IP_CONFIG"  # path of the ip_config file
PART_CONFIG = "DISTGNN_PART_CONFIG"  # path of the partition JSON
NUM_SERVERS = "DISTGNN_NUM_SERVERS"  # servers per machine (1 main + backups)
NUM_TRAINERS = "DISTGNN_NUM_TRAINERS"  # trainers per machine
NUM_SAMPLERS = "DISTGNN_NUM_SAMPLERS"  # sampler worker processes per trainer
MACHINE_ID = "DISTGNN_MACHINE_ID"  # line of this machine in ip_config = partition id
SERVER_ID = "DISTGNN_SERVER_ID"  # servers only: 0 is the main server
JOB_ID = "DISTGNN_JOB_ID"  # names shared memory and sockets of this job
TOKEN = "DISTGNN_TOKEN"  # per-job RPC secret; never on a command line
CURVE = "DISTGNN_CURVE"  # "1": encrypt RPC with CURVE keys derived from the token
RPC_TIMEOUT = "DISTGNN_RPC_TIMEOUT"  # seconds a remote call may take
RESTART_COUNT = "DISTGNN_RESTART_COUNT"  # 0 on the first start, k after the k-th restart (--max-restarts)
