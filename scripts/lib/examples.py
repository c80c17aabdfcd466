"""Running the examples from the study scripts: the build, the mpirun command line for a layout
of ranks x threads on this machine, and the metrics records a run wrote."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build(*packages):
    """Installs the dependencies (and the given Debian packages) and builds, quietly."""
    extra = f" && minidl_install_packages {' '.join(packages)}" if packages else ""
    subprocess.run(["bash", "-c", f"source '{ROOT}/scripts/lib/common.sh' && minidl_install_deps"
                    f"{extra} && minidl_build"], check=True, stdout=subprocess.DEVNULL)


def command(model, ranks, threads, flags):
    """The command line (and environment) running `model` on `ranks` processes of `threads`
    threads each with `flags`."""
    binary = os.path.join(os.environ.get("MINIDL_BUILD_DIR", os.path.join(ROOT, "build")),
                          "examples", model)
    flags = ["--threads", str(threads)] + list(flags)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if ranks == 1:
        return [binary] + flags, env
    cmd = ["mpirun", "-np", str(ranks), "-x", f"OMP_NUM_THREADS={threads}"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if ranks * threads > os.cpu_count():
        # Idle OpenMP threads must sleep rather than spin, or they take the cores that the
        # other ranks' threads wait for (a 2x2 MLP epoch on 2 cores: 164 s spinning).
        cmd += ["--oversubscribe", "-x", "OMP_WAIT_POLICY=passive"]
    if threads > 1:
        cmd += ["--bind-to", "none"]
    return cmd + [binary] + flags, env


def run(model, ranks, threads, flags, metrics):
    """Runs the example with --metrics `metrics` and returns the records it wrote."""
    cmd, env = command(model, ranks, threads, list(flags) + ["--metrics", metrics])
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    with open(metrics) as f:
        return [json.loads(line) for line in f if line.strip()]
