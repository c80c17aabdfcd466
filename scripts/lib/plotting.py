"""Plotting shared by the scripts: reading the examples' --metrics files, the loss and accuracy
curves of scripts/plot-metrics, and a speedup plot for scaling studies.

Matplotlib comes from Debian's python3-matplotlib: pyplot() installs it through
scripts/lib/common.sh's minidl_install_packages when it is missing. Figures are written with the
Agg backend (no display needed), to a temporary file renamed over the target, so an interrupted
run leaves no half-written PNG.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Configuration keys that name a run well, in the order a legend shows them.
PREFERRED_KEYS = ["example", "program", "dataset", "ranks", "np", "threads", "thread_mode",
                  "reduce", "bucket_mb", "overlap", "backend", "batch_size", "lr", "momentum",
                  "hidden", "activation", "fuse", "upscale", "seed"]
# Longer values (a model's whole description) make a legend unreadable.
MAX_VALUE_CHARS = 24
MAX_LABEL_ITEMS = 6


class MetricsError(Exception):
    """A metrics file that cannot be read; the message names the file (and line)."""


class Run:
    """One --metrics file: its configuration (a first record {"config": {...}}, or {}) and its
    epoch records in file order."""

    def __init__(self, path, config, epochs):
        self.path = path
        self.config = config
        self.epochs = epochs

    def series(self, key):
        """(epochs, values) of the records that have key."""
        xs, ys = [], []
        for r in self.epochs:
            if isinstance(r.get(key), (int, float)):
                xs.append(r["epoch"])
                ys.append(r[key])
        return xs, ys


def read_metrics(path):
    """Reads a JSON-lines metrics file as the examples write it with --metrics FILE."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise MetricsError(f"{path}: cannot read: {e.strerror}") from None
    config, epochs = {}, []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise MetricsError(f"{path}:{number}: not a JSON object: {e.msg} at column {e.colno}") from None
        if not isinstance(record, dict):
            raise MetricsError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        if "epoch" in record:
            if not isinstance(record["epoch"], (int, float)):
                raise MetricsError(f"{path}:{number}: \"epoch\" must be a number, got {record['epoch']!r}")
            epochs.append(record)
        elif isinstance(record.get("config"), dict):
            config = record["config"]
        elif "peak_rss_bytes" in record or "kernel_times" in record:
            pass  # after the last epoch: the ranks' peak memory, the profile: nothing to draw
        else:
            raise MetricsError(f"{path}:{number}: a record needs \"epoch\" (or, as the first "
                               f"record, \"config\", or, after the last epoch, "
                               f"\"peak_rss_bytes\" or \"kernel_times\"); got the keys "
                               f"{sorted(record)}")
    if not epochs:
        raise MetricsError(f"{path}: no epoch records (lines with \"epoch\")")
    return Run(path, config, epochs)


def _short(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_short(v) for v in value)
    return str(value)


def run_labels(runs):
    """A legend label per run: the configuration's "label" or "name" when given; else the
    configuration settings in which the runs differ (the well-known ones first; for one run, or
    runs that do not differ, the well-known settings present); the file name when there is no
    configuration. Labels that would coincide get the file name appended."""
    def settings(config):
        return {k: _short(v) for k, v in config.items()
                if isinstance(v, (str, int, float, bool, list)) and len(_short(v)) <= MAX_VALUE_CHARS}

    configs = [settings(r.config) for r in runs]
    keys = {k for c in configs for k in c}
    differing = {k for k in keys if len({c.get(k) for c in configs}) > 1}
    known = [k for k in PREFERRED_KEYS if k in keys]
    if differing:
        shown = [k for k in known if k in differing] + sorted(differing - set(PREFERRED_KEYS))
    else:
        shown = known
    labels = []
    for run, config in zip(runs, configs):
        name = run.config.get("label") or run.config.get("name")
        parts = [f"{k}={config[k]}" for k in shown if k in config][:MAX_LABEL_ITEMS]
        if name:
            labels.append(str(name))
        elif parts:
            labels.append(" ".join(parts))
        else:
            labels.append(os.path.basename(run.path))
    for i, label in enumerate(labels):
        if labels.count(label) > 1 and label != os.path.basename(runs[i].path):
            labels[i] = f"{label} ({os.path.basename(runs[i].path)})"
    return labels


def pyplot(program):
    """matplotlib.pyplot on the Agg backend; installs python3-matplotlib when it is missing.
    Exits naming the package when it cannot be had."""
    try:
        import matplotlib
    except ImportError:
        print(f"{program}: matplotlib is missing; installing python3-matplotlib", file=sys.stderr)
        common = os.path.join(ROOT, "scripts", "lib", "common.sh")
        done = subprocess.run(["bash", "-c", 'source "$0" && minidl_install_packages python3-matplotlib',
                               common])
        try:
            import importlib
            importlib.invalidate_caches()
            import matplotlib
        except ImportError:
            sys.exit(f"{program}: error: matplotlib is not available to {sys.executable} "
                     f"(Debian package python3-matplotlib; install exit status {done.returncode})")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, path):
    """Writes fig as PNG to path through a temporary file in the same directory."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".plot-", suffix=".png", dir=directory)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        fig.savefig(tmp, format="png", dpi=100)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it private; a plot is not
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def plot_curves(plt, runs, labels, title=None):
    """Two panels: loss and accuracy against epoch; each run one colour, training solid, test
    dashed. Returns the figure."""
    from matplotlib.lines import Line2D

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = (("train", "-"), ("test", "--"))
    for i, run in enumerate(runs):
        color = colors[i % len(colors)]
        for split, style in styles:
            xs, ys = run.series(f"{split}_loss")
            if xs:
                loss_ax.plot(xs, ys, style, color=color, marker="o", markersize=3)
            xs, ys = run.series(f"{split}_accuracy")
            if xs:
                acc_ax.plot(xs, [100 * y for y in ys], style, color=color, marker="o", markersize=3)
    for ax, name in ((loss_ax, "loss"), (acc_ax, "accuracy (%)")):
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
        # Epochs are whole numbers.
        ax.xaxis.get_major_locator().set_params(integer=True)
    loss_ax.set_title("loss")
    acc_ax.set_title("accuracy")
    # One legend entry per run (its colour) and one per split (its line style).
    handles = [Line2D([], [], color=colors[i % len(colors)], label=label)
               for i, label in enumerate(labels)]
    handles += [Line2D([], [], color="black", linestyle=style, label=split)
                for split, style in styles]
    loss_ax.legend(handles=handles, fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_speedup(plt, points, title=None, splits=None):
    """Speedup against workers with the line of linear speedup; points are (workers, speedup,
    label). With splits, (label, compute, communication, waiting) seconds per configuration, a
    second panel stacks each configuration's time split. Returns the figure."""
    panels = 2 if splits else 1
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    ax = axes[0][0]
    top = max([w for w, _, _ in points] + [1])
    ax.plot([1, top], [1, top], "--", color="grey", label="linear")
    # Points, not a line: several configurations may have the same number of workers.
    ax.plot([w for w, _, _ in points], [s for _, s, _ in points], "o", label="measured")
    for w, s, label in points:
        ax.annotate(label, (w, s), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("workers (processes x threads)")
    ax.set_ylabel("speedup over serial")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    if splits:
        bx = axes[0][1]
        names = [s[0] for s in splits]
        compute = [s[1] for s in splits]
        comm = [s[2] for s in splits]
        wait = [s[3] for s in splits]
        bx.bar(names, compute, label="compute")
        bx.bar(names, comm, bottom=compute, label="communication")
        bx.bar(names, wait, bottom=[a + b for a, b in zip(compute, comm)], label="waiting")
        bx.set_xlabel("processes x threads")
        bx.set_ylabel("seconds per epoch")
        bx.set_title("time split")
        bx.legend()
    fig.tight_layout()
    return fig
