"""An alpha-beta cost model of data-parallel training: predicts the time of an epoch for a layout
(nodes, ranks per node, threads per rank, reduction strategy, bucket size) from a calibration
file, and picks the layout and bucket size it predicts fastest.

The calibration (scripts/calibrate-cost-model writes it; JSON):

    {"network": {"alpha": S, "beta": S_PER_BYTE},      # between nodes: latency, 1 / bandwidth
     "shm": {"alpha": S, "beta": S_PER_BYTE},          # between ranks of one node
     "models": {"mnist_mlp": {
         "sample_seconds": S,      # forward + backward of one sample, one thread
         "step_seconds": S,        # per step whatever the batch: update, launch overheads
         "thread_efficiency": {"2": E, ...},  # speedup of T threads over one, divided by T
         "gradient_bytes": [B, ...],          # the gradients, in the order the backward makes them
         "train_samples": N, "batch_size": B,
         # optional, measured on this machine by a 2-rank run (absent: 0, 1, 1):
         "multi_rank_step_seconds": S,  # per step, what a multi-rank graph adds
         "collective_overhead_seconds": S,  # per bucket, the app's collective over the formula
         "oversubscription_slowdown": X}},  # a step's slowdown per doubling of threads/core
     "cores": C}                      # cores of the calibrated machine (for oversubscription)

"network" may instead come from a SimGrid platform file (platform_network()), so the model can
be set beside the simulator on the same cluster. Costs:

- compute of a step on a rank: step_seconds + sample_seconds * (its samples) / (T * E(T));
- an allreduce of n bytes (f32) over P ranks with latency a and inverse bandwidth b: the
  algorithm OpenMPI 4.1's fixed decision rule picks by P and n (coll_tuned_decision_fixed, which
  SimGrid 3.32's "ompi" selector copies, so the simulator runs the same; ALLREDUCE_RULE):
  recursive doubling, L (a + n b) with L = ceil(log2 P); the ring (reduce-scatter then
  allgather), 2 (P - 1) (a + (n / P) b); the segmented ring, whose reduce-scatter runs once per
  1 MiB segment of a rank's block, (P - 1) ((k + 1) a + 2 (n / P) b) for k segments; a reduce
  and a broadcast, 2 L (a + n b); Rabenseifner's (reduce-scatter by recursive halving,
  allgather by recursive doubling), 2 L a + 2 ((P - 1) / P) n b. From 16 KiB (fewer bytes on
  small jobs) it is Rabenseifner's, whose latency grows with log2 P;
- buckets: the gradients packed in backward order into buckets of at most bucket_bytes (a larger
  gradient alone; 0: one per gradient), one allreduce each;
- "allreduce": one allreduce over all ranks, at the network's cost when the job spans several
  nodes, else at the shared memory's;
- "hierarchical": inside each node a reduce and a broadcast through shared memory
  (2 * (a_shm + n b_shm) per bucket with several ranks on the node), and an allreduce among the
  node leaders over the network.

Three measured terms correct the formulas on a real machine (scripts/calibrate-cost-model fits
each from one run; a calibration without them gets the neutral value):

- multi-rank compute (multi_rank_step_seconds): with one rank the graph fuses each SGD update
  into its weight-gradient product; with several, the reduction sits between them, so each
  parameter gets its own update kernel, plus the buckets' pack and unpack kernels. Per-rank
  compute at half the batch is then well above half the one-rank step. Fitted from a profiled
  2-rank run (compute per step minus the one-rank formula at its per-rank batch) and added to
  every layout of more than one rank;
- the app's collectives (collective_overhead_seconds): with several ranks the app runs each
  bucket's reduction in its non-blocking form (MPI_Iallreduce awaited with MPI_Test,
  "watched"), and a rank's communication timer also holds its wait for the slower rank; the
  blocking allreduce bench/mpi_costs times has neither. Fitted from the same profiled 2-rank
  run: its communication and waiting per step minus the formulas' for that layout, split
  evenly over its buckets; added to each bucket's reduction of every layout of several ranks
  (a per-call cost, so smaller buckets pay it more often). It was measured through shared
  memory on 2 ranks: on a network and at other rank counts it is an extrapolation;
- oversubscription (oversubscription_slowdown): when ranks x threads on a node exceed its cores
  (cal "cores", or best()'s cores_per_node), each rank computes on cores / ranks cores (its
  threads time-slice them), and a step is slowed further by time-slicing between the ranks and
  by OpenMP barriers whose threads were preempted: the step (compute and communication) is
  multiplied by X ** log2(ranks x threads / cores). X is fitted from one oversubscribed run
  (2 ranks x 2 threads on 2 cores): its step time over the model's step without the term.

Nothing overlaps (the default, --overlap off): a step is compute + communication.

A compute table (scripts/simulate-cluster --compute profile writes it: the per-node times the
simulator injects, and their sum per step at each measured batch per rank) can replace the
calibration's compute: compute_from_table() / CostModel.compute_table; then the model and the
simulator use the same compute figures and differ only in communication.
"""
import json
import math
import re

STRATEGIES = ("allreduce", "hierarchical")
BUCKET_CHOICES_MB = (0.0, 0.25, 1.0, 4.0, 16.0, 64.0)


class CalibrationError(Exception):
    """A calibration file that cannot be used; the message names the file and the key."""


SEGMENT = 1 << 20  # bytes: OpenMPI's segment of the segmented ring
ELEMENT = 4  # bytes of an f32, the only type the gradients are reduced in

# OpenMPI 4.1's allreduce rule for commutative operations, as SimGrid 3.32 copies it: per
# communicator size (below the first bound of a row), the algorithm below each message size
# (bytes), the last one above. Algorithms: "rdb" recursive doubling, "ring", "segring" the
# segmented ring, "redbcast" a reduce and a broadcast, "rab" Rabenseifner's.
ALLREDUCE_RULE = [
    (4, [(8, "ring"), (4096, "rdb"), (8192, "ring"), (16384, "rdb"), (65536, "ring"),
         (262144, "segring")], "rab"),
    (8, [(16, "ring"), (8192, "rdb")], "rab"),
    (16, [(8192, "rdb")], "rab"),
    (32, [(64, "segring"), (4096, "rdb")], "rab"),
    (64, [(128, "segring")], "rab"),
    (128, [(262144, "rdb")], "rab"),
    (256, [(131072, "redbcast"), (262144, "rdb")], "rab"),
    (512, [(4096, "redbcast")], "rab"),
    (2048, [(2048, "redbcast"), (16384, "rdb")], "rab"),
    (4096, [(2048, "redbcast"), (4096, "segring"), (16384, "rdb")], "rab"),
    (None, [(2048, "redbcast"), (16384, "segring"), (32768, "rdb")], "rab"),
]


def allreduce_algorithm(nbytes, ranks):
    """The algorithm OpenMPI 4.1's fixed rule (SMPI's "ompi" selector) picks."""
    for below, sizes, above in ALLREDUCE_RULE:
        if below is None or ranks < below:
            for limit, name in sizes:
                if nbytes < limit:
                    return name
            return above
    raise AssertionError("the rule's last row takes every size")


def allreduce_seconds(nbytes, ranks, alpha, beta):
    """Time of one allreduce of nbytes (f32) over ranks ranks, by the algorithm OpenMPI's fixed
    rule picks (see the module's docstring); 0 for one rank or no bytes."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    steps = math.ceil(math.log2(ranks))
    algorithm = allreduce_algorithm(nbytes, ranks)
    count = nbytes // ELEMENT
    if algorithm == "ring" and count >= ranks:
        block = (count // ranks) * ELEMENT
        remainder = (count % ranks) * ELEMENT
        return (2.0 * (ranks - 1) * (alpha + block * beta) +
                allreduce_seconds(remainder, ranks, alpha, beta))
    if algorithm == "segring" and count >= ranks:
        block = nbytes / ranks
        segments = max(1, math.ceil(block / SEGMENT))
        return (ranks - 1) * ((segments + 1) * alpha + 2.0 * block * beta)
    if algorithm == "rab" and count >= ranks:
        return 2.0 * steps * alpha + 2.0 * (ranks - 1) / ranks * nbytes * beta
    if algorithm == "redbcast":
        return 2.0 * steps * (alpha + nbytes * beta)
    return steps * (alpha + nbytes * beta)  # recursive doubling (and what falls back to it)


def buckets(gradient_bytes, bucket_bytes):
    """Sizes of the buckets the gradients (in backward order) are packed into: each at most
    bucket_bytes, a larger gradient alone; bucket_bytes 0: one per gradient."""
    if bucket_bytes <= 0:
        return [g for g in gradient_bytes if g > 0]
    out, current = [], 0
    for g in gradient_bytes:
        if g > bucket_bytes:
            if current:
                out.append(current)
                current = 0
            out.append(g)
        elif current + g > bucket_bytes:
            out.append(current)
            current = g
        else:
            current += g
    if current:
        out.append(current)
    return out


class Layout:
    """nodes x ranks_per_node ranks of threads threads each, a strategy and a bucket size (MiB)."""

    def __init__(self, nodes, ranks_per_node=1, threads=1, strategy="allreduce", bucket_mb=0.25):
        if nodes < 1 or ranks_per_node < 1 or threads < 1:
            raise ValueError(f"a layout needs at least one node, rank and thread, got {nodes} "
                             f"node(s) x {ranks_per_node} rank(s) x {threads} thread(s)")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy '{strategy}': expected one of {', '.join(STRATEGIES)}")
        if bucket_mb < 0:
            raise ValueError(f"bucket size {bucket_mb} MiB: expected >= 0")
        self.nodes, self.ranks_per_node, self.threads = nodes, ranks_per_node, threads
        self.strategy, self.bucket_mb = strategy, bucket_mb

    @property
    def ranks(self):
        return self.nodes * self.ranks_per_node

    def __repr__(self):
        return (f"{self.nodes} node(s) x {self.ranks_per_node} rank(s) x {self.threads} "
                f"thread(s), {self.strategy}, buckets of {self.bucket_mb:g} MiB")


class Prediction:
    def __init__(self, layout, steps, compute, communication, slowdown=1.0):
        self.layout = layout
        self.steps = steps
        self.compute_seconds = compute  # per step
        self.comm_seconds = communication  # per step
        self.slowdown = slowdown  # of the whole step, by oversubscription

    @property
    def step_seconds(self):
        return (self.compute_seconds + self.comm_seconds) * self.slowdown

    @property
    def epoch_seconds(self):
        return self.steps * self.step_seconds

    @property
    def comm_share(self):
        """Communication's share of a step (the oversubscription's slowdown scales both parts)."""
        total = self.compute_seconds + self.comm_seconds
        return self.comm_seconds / total if total > 0 else 0.0


class CostModel:
    def __init__(self, calibration, source="calibration"):
        self.source = source
        self.cal = calibration
        self.network = self._link("network")
        self.shm = self._link("shm")

    def _need(self, d, key, where):
        if not isinstance(d, dict) or key not in d:
            raise CalibrationError(f"{self.source}: missing '{where}{key}'")
        return d[key]

    def _link(self, name):
        link = self._need(self.cal, name, "")
        alpha = self._need(link, "alpha", name + ".")
        beta = self._need(link, "beta", name + ".")
        if not all(isinstance(v, (int, float)) and v >= 0 for v in (alpha, beta)):
            raise CalibrationError(f"{self.source}: '{name}.alpha' and '{name}.beta' must be "
                                   f"numbers >= 0, got {alpha!r} and {beta!r}")
        return float(alpha), float(beta)

    def model(self, name):
        models = self._need(self.cal, "models", "")
        if name not in models:
            known = ", ".join(sorted(models)) or "none"
            raise CalibrationError(f"{self.source}: no calibration of model '{name}' "
                                   f"(calibrated: {known})")
        m = models[name]
        for key in ("sample_seconds", "step_seconds", "gradient_bytes", "train_samples"):
            self._need(m, key, f"models.{name}.")
        for key in ("multi_rank_step_seconds", "collective_overhead_seconds",
                    "oversubscription_slowdown"):
            v = m.get(key, 1.0)
            if not isinstance(v, (int, float)) or v < 0 or \
                    (key == "oversubscription_slowdown" and v <= 0):
                raise CalibrationError(f"{self.source}: 'models.{name}.{key}' must be a number "
                                       f"{'> 0' if key == 'oversubscription_slowdown' else '>= 0'}"
                                       f", got {v!r}")
        return m

    def thread_factor(self, m, threads):
        """Speedup of threads threads over one on this model's compute."""
        if threads == 1:
            return 1.0
        eff = m.get("thread_efficiency", {})
        if str(threads) in eff:
            return threads * float(eff[str(threads)])
        # Unmeasured thread count: the efficiency of the largest measured one below it.
        below = [int(t) for t in eff if int(t) <= threads]
        e = float(eff[str(max(below))]) if below else 1.0
        return threads * e

    def communication(self, m, layout):
        """Seconds per step spent reducing the gradients."""
        sizes = buckets(m["gradient_bytes"], int(layout.bucket_mb * 1024 * 1024))
        if layout.ranks <= 1:
            return 0.0
        total = float(m.get("collective_overhead_seconds", 0.0)) * len(sizes)
        net_a, net_b = self.network
        shm_a, shm_b = self.shm
        for n in sizes:
            if layout.strategy == "allreduce":
                a, b = (net_a, net_b) if layout.nodes > 1 else (shm_a, shm_b)
                total += allreduce_seconds(n, layout.ranks, a, b)
            else:
                if layout.ranks_per_node > 1:
                    total += 2.0 * (shm_a + n * shm_b)
                total += allreduce_seconds(n, layout.nodes, net_a, net_b)
        return total

    compute_table = None  # a compute table (compute_from_table) replacing the calibration's

    def predict(self, name, layout, global_batch=None, cores=None):
        """The epoch of model name on layout, at global_batch samples per step (default: the
        calibrated batch size), on nodes of cores cores (default: the calibration's "cores";
        neither: no oversubscription)."""
        m = self.model(name)
        batch = global_batch or int(m.get("batch_size", 64))
        if batch < layout.ranks:
            raise ValueError(f"a global batch of {batch} cannot give each of {layout.ranks} "
                             f"ranks a sample")
        steps = max(1, int(m["train_samples"]) // batch)
        per_rank = math.ceil(batch / layout.ranks)  # the slowest rank's share
        cores = cores or self.cal.get("cores")
        threads, slowdown = layout.threads, 1.0
        busy = layout.ranks_per_node * layout.threads
        if cores and busy > cores:  # oversubscribed: see the module's docstring
            threads = max(1, min(layout.threads, int(cores) // layout.ranks_per_node))
            slowdown = float(m.get("oversubscription_slowdown", 1.0)) ** math.log2(busy / cores)
        if self.compute_table is not None:
            compute = compute_from_table(self.compute_table, per_rank, layout.ranks)
        else:
            compute = float(m["step_seconds"]) + float(m["sample_seconds"]) * per_rank / \
                self.thread_factor(m, threads)
            if layout.ranks > 1:
                compute += float(m.get("multi_rank_step_seconds", 0.0))
        return Prediction(layout, steps, compute, self.communication(m, layout), slowdown)

    def best(self, name, nodes, cores_per_node, global_batch=None):
        """(best prediction, all predictions) over ranks per node x threads filling the cores,
        both strategies and the bucket sizes of BUCKET_CHOICES_MB."""
        options = []
        for rpn in range(1, cores_per_node + 1):
            if cores_per_node % rpn:
                continue
            for strategy in STRATEGIES:
                if strategy == "hierarchical" and (rpn == 1 or nodes == 1):
                    continue  # the same as allreduce there
                for bucket in BUCKET_CHOICES_MB:
                    layout = Layout(nodes, rpn, cores_per_node // rpn, strategy, bucket)
                    if global_batch is not None and global_batch < layout.ranks:
                        continue
                    options.append(self.predict(name, layout, global_batch, cores_per_node))
        if not options:
            raise ValueError(f"no layout of {nodes} node(s) x {cores_per_node} core(s) gives "
                             f"every rank a sample of a global batch of {global_batch}")
        return min(options, key=lambda p: p.epoch_seconds), options


def compute_from_table(table, per_rank, ranks=2):
    """Seconds of compute per step at per_rank samples per rank from a compute table's
    step_compute_seconds ({batch per rank: seconds}; for one rank its
    step_compute_seconds_one_rank when it has any, the graph of one rank being another):
    linear between the measured batches, along the nearest two beyond them, never below 0."""
    key = "step_compute_seconds"
    if ranks == 1 and table.get("step_compute_seconds_one_rank"):
        key = "step_compute_seconds_one_rank"
    pts = sorted((int(b), float(t)) for b, t in table[key].items())
    if len(pts) == 1:
        return pts[0][1]
    hi = 1
    while hi + 1 < len(pts) and pts[hi][0] < per_rank:
        hi += 1
    (b0, t0), (b1, t1) = pts[hi - 1], pts[hi]
    return max(0.0, t0 + (per_rank - b0) * (t1 - t0) / (b1 - b0))


def gradient_bytes(path):
    """Bytes of each f32 parameter of a safetensors file, in the order the backward makes the
    gradients (the reverse of the parameters' order in the file)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    params = [(v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
              for k, v in header.items() if k != "__metadata__"]
    return [size for _, size in sorted(params, reverse=True)]


# SimGrid's default loopback (network/loopback-lat, network/loopback-bw): what ranks on one
# simulated host pay, for a model made from a compute table and a platform alone.
SIMGRID_LOOPBACK = (15e-6, 1.0 / 498e6)


def from_table(model, table, platform, train_samples):
    """A cost model of model from a compute table (its compute and gradient sizes) and a
    platform file (the network), with SimGrid's loopback for ranks of one node."""
    alpha, beta = platform_network(platform)
    cal = {"network": {"alpha": alpha, "beta": beta},
           "shm": {"alpha": SIMGRID_LOOPBACK[0], "beta": SIMGRID_LOOPBACK[1]},
           "models": {model: {"sample_seconds": 0.0, "step_seconds": 0.0,
                              "gradient_bytes": table["gradient_bytes"],
                              "train_samples": train_samples,
                              "batch_size": int(table.get("batch_size", 64))}}}
    m = CostModel(cal, source=f"the compute table of {model} and {platform}")
    m.compute_table = table
    return m


def load(path):
    try:
        with open(path) as f:
            cal = json.load(f)
    except OSError as e:
        raise CalibrationError(f"{path}: cannot read the calibration: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
    return CostModel(cal, source=path)


_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def _quantity(text, what, path):
    """A SimGrid quantity: a bandwidth ('10Gbps' bits, '1.25GBps' bytes, 'GiBps') in bytes per
    second, or a latency ('50us', 'ms', 's', 'ns') in seconds."""
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([kKMGT]i?)?(bps|Bps|s|ms|us|ns)\s*",
                     text or "")
    if not m:
        raise CalibrationError(f"{path}: cannot read the {what} '{text}'")
    v, prefix, unit = float(m.group(1)), m.group(2) or "", m.group(3)
    if unit in ("bps", "Bps"):
        v *= _BINARY[prefix] if prefix.endswith("i") else _DECIMAL[prefix]
        return v / 8.0 if unit == "bps" else v
    if prefix:
        raise CalibrationError(f"{path}: cannot read the {what} '{text}'")
    return v * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]


def platform_network(path):
    """(alpha, beta) between two nodes of the <cluster> of a SimGrid platform file: the latency
    of the links on the path (2 for a star, 4 across a two-level fat tree) and 1 / the link
    bandwidth."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise CalibrationError(f"{path}: cannot read the platform: {e.strerror}") from None
    m = re.search(r"<cluster\b([^>]*)>", text, re.S)
    if not m:
        raise CalibrationError(f"{path}: no <cluster> element")
    attrs = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    bw = _quantity(attrs.get("bw"), "bandwidth 'bw'", path)
    lat = _quantity(attrs.get("lat"), "latency 'lat'", path)
    hops = 2
    if attrs.get("topology") == "FAT_TREE":
        hops = 2 * int(attrs.get("topo_parameters", "1").split(";")[0])
    return hops * lat, 1.0 / bw
