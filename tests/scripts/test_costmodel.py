#!/usr/bin/python3
"""Unit tests of the cost model (scripts/lib/costmodel.py) and of the scripts that use it:
the alpha-beta formulas against hand-computed values, bucketing, the layout it picks on a
calibration made up so that the answer is known, the measured terms (multi-rank compute, the
program's collectives, oversubscription) and calibrate-cost-model's fits of them on made-up
runs, platform files, and bad calibrations."""
import importlib.machinery
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
import unittest.mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
import costmodel  # noqa: E402

MB = 1024 * 1024


def calibration(**over):
    cal = {"network": {"alpha": 50e-6, "beta": 1 / 1.25e9},
           "shm": {"alpha": 1e-6, "beta": 1 / 10e9},
           "models": {"m": {"sample_seconds": 1e-3, "step_seconds": 2e-3,
                            "thread_efficiency": {"2": 0.5, "4": 0.75},
                            "gradient_bytes": [4 * MB, 1 * MB, 1 * MB],
                            "train_samples": 6400, "batch_size": 64}}}
    cal.update(over)
    return cal


class Formulas(unittest.TestCase):
    def test_allreduce_one_rank_is_free(self):
        self.assertEqual(costmodel.allreduce_seconds(1000, 1, 1.0, 1.0), 0.0)
        self.assertEqual(costmodel.allreduce_seconds(0, 8, 1.0, 1.0), 0.0)

    def test_small_message_takes_recursive_doubling(self):
        # 8 ranks, under 8192 bytes: doubling, 3 (a + n b)
        a, b = 10e-6, 1e-9
        self.assertAlmostEqual(costmodel.allreduce_seconds(8, 16, a, b), 4 * (a + 8 * b))
        self.assertAlmostEqual(costmodel.allreduce_seconds(8000, 8, a, b), 3 * (a + 8000 * b))

    def test_openmpi_rule(self):
        # OpenMPI 4.1's table by communicator and message size (SMPI 3.32's ompi selector)
        pick = costmodel.allreduce_algorithm
        self.assertEqual(pick(4, 2), "ring")
        self.assertEqual(pick(100, 2), "rdb")
        self.assertEqual(pick(10000, 2), "rdb")
        self.assertEqual(pick(20000, 2), "ring")
        self.assertEqual(pick(100000, 2), "segring")
        self.assertEqual(pick(300000, 2), "rab")
        self.assertEqual(pick(8192, 8), "rab")
        self.assertEqual(pick(100000, 200), "redbcast")
        self.assertEqual(pick(200000, 200), "rdb")
        self.assertEqual(pick(8192, 1024), "rdb")
        self.assertEqual(pick(256 * 1024, 1024), "rab")
        self.assertEqual(pick(8192, 8192), "segring")

    def test_rabenseifner(self):
        # 1024 ranks, 256 KiB, 100 us: 2 log2 P latencies, 2 (P - 1) / P of the bytes
        a, b, n = 100e-6, 0.8e-9, 256 * 1024
        self.assertAlmostEqual(costmodel.allreduce_seconds(n, 1024, a, b),
                               20 * a + 2 * 1023 / 1024 * n * b)

    def test_ring_and_its_remainder(self):
        # 2 ranks, 8000 bytes (the ring from 4096 to 8192): blocks of 1000 elements
        a, b = 10e-6, 1e-9
        self.assertAlmostEqual(costmodel.allreduce_seconds(8000, 2, a, b), 2 * (a + 4000 * b))
        # 2001 elements: blocks of 1000, one element (4 bytes) left: doubling
        self.assertAlmostEqual(costmodel.allreduce_seconds(8004, 2, a, b),
                               2 * (a + 4000 * b) + (a + 4 * b))

    def test_segmented_ring(self):
        # 2 ranks, 128 KiB: blocks of 64 KiB, one segment
        a, b, n = 10e-6, 1e-9, 128 * 1024
        self.assertAlmostEqual(costmodel.allreduce_seconds(n, 2, a, b),
                               1 * (2 * a + 2 * 64 * 1024 * b))

    def test_reduce_and_broadcast(self):
        a, b = 10e-6, 1e-9
        self.assertAlmostEqual(costmodel.allreduce_seconds(100000, 200, a, b),
                               2 * 8 * (a + 100000 * b))

    def test_compute_from_a_table(self):
        table = {"step_compute_seconds": {"1": 1e-3, "4": 2.5e-3, "16": 8.5e-3}}
        self.assertAlmostEqual(costmodel.compute_from_table(table, 4), 2.5e-3)
        self.assertAlmostEqual(costmodel.compute_from_table(table, 10), 5.5e-3)
        self.assertAlmostEqual(costmodel.compute_from_table(table, 32), 16.5e-3)
        m = costmodel.CostModel(calibration())
        m.compute_table = table
        p = m.predict("m", costmodel.Layout(16, 1, 1), 64)
        self.assertAlmostEqual(p.compute_seconds, 2.5e-3)

    def test_non_power_of_two_rounds_up(self):
        self.assertAlmostEqual(costmodel.allreduce_seconds(4, 3, 1.0, 0.0), 2.0)

    def test_buckets(self):
        self.assertEqual(costmodel.buckets([100, 200, 50, 1000, 30], 256), [100, 250, 1000, 30])
        self.assertEqual(costmodel.buckets([100, 200], 0), [100, 200])
        self.assertEqual(costmodel.buckets([100, 200], 10**9), [300])


class Predictions(unittest.TestCase):
    def setUp(self):
        self.model = costmodel.CostModel(calibration())

    def test_one_process_is_compute_only(self):
        p = self.model.predict("m", costmodel.Layout(1, 1, 1))
        self.assertEqual(p.comm_seconds, 0.0)
        self.assertEqual(p.steps, 100)
        self.assertAlmostEqual(p.epoch_seconds, 100 * (2e-3 + 64 * 1e-3))

    def test_threads_use_the_measured_efficiency(self):
        p = self.model.predict("m", costmodel.Layout(1, 1, 2))
        self.assertAlmostEqual(p.compute_seconds, 2e-3 + 64e-3 / (2 * 0.5))
        p3 = self.model.predict("m", costmodel.Layout(1, 1, 3))  # unmeasured: 2's efficiency
        self.assertAlmostEqual(p3.compute_seconds, 2e-3 + 64e-3 / (3 * 0.5))

    def test_two_nodes_pay_the_network(self):
        lay = costmodel.Layout(2, 1, 1, "allreduce", 0.0)
        p = self.model.predict("m", lay)
        expect = sum(costmodel.allreduce_seconds(n, 2, 50e-6, 1 / 1.25e9)
                     for n in (4 * MB, MB, MB))
        self.assertAlmostEqual(p.comm_seconds, expect)
        self.assertAlmostEqual(p.compute_seconds, 2e-3 + 32e-3)

    def test_hierarchical_adds_the_node_level(self):
        lay = costmodel.Layout(4, 2, 1, "hierarchical", 64.0)  # one bucket of 6 MiB
        p = self.model.predict("m", lay)
        n = 6 * MB
        expect = 2 * (1e-6 + n / 10e9) + costmodel.allreduce_seconds(n, 4, 50e-6, 1 / 1.25e9)
        self.assertAlmostEqual(p.comm_seconds, expect)

    def test_a_rank_without_a_sample_is_refused(self):
        with self.assertRaisesRegex(ValueError, "global batch of 64 cannot give each of 128"):
            self.model.predict("m", costmodel.Layout(128, 1, 1))

    def test_picks_the_known_best(self):
        # Threads are useless (efficiency 1/T), so ranks fill the cores; a huge network latency
        # makes one bucket best (16 MiB, the smallest holding all 6 MiB), and the node level
        # pays off over the slow network.
        cal = calibration(network={"alpha": 1e-2, "beta": 1e-9})
        cal["models"]["m"]["thread_efficiency"] = {"2": 0.5, "4": 0.25}
        best, options = costmodel.CostModel(cal).best("m", 4, 4)
        self.assertEqual((best.layout.ranks_per_node, best.layout.threads), (4, 1))
        self.assertEqual(best.layout.strategy, "hierarchical")
        self.assertEqual(best.layout.bucket_mb, 16.0)
        self.assertEqual(best.epoch_seconds, min(o.epoch_seconds for o in options))

    def test_picks_threads_when_they_scale(self):
        cal = calibration(network={"alpha": 1e-2, "beta": 1e-9})
        cal["models"]["m"]["thread_efficiency"] = {"2": 1.0, "4": 1.0}
        best, _ = costmodel.CostModel(cal).best("m", 4, 4)
        self.assertEqual((best.layout.ranks_per_node, best.layout.threads), (1, 4))


class MeasuredTerms(unittest.TestCase):
    """The terms a real machine adds: multi-rank compute, the app's collectives, oversubscription."""

    def cal(self, **terms):
        cal = calibration()
        cal["models"]["m"].update(terms)
        return costmodel.CostModel(cal)

    def test_multi_rank_compute_is_added_to_several_ranks_only(self):
        model = self.cal(multi_rank_step_seconds=5e-3)
        one = model.predict("m", costmodel.Layout(1, 1, 1))
        self.assertAlmostEqual(one.compute_seconds, 2e-3 + 64e-3)
        two = model.predict("m", costmodel.Layout(1, 2, 1))
        self.assertAlmostEqual(two.compute_seconds, 2e-3 + 32e-3 + 5e-3)
        # a compute table measured its multi-rank rows on a multi-rank run already
        model.compute_table = {"step_compute_seconds": {"16": 1.0, "32": 2.0}}
        self.assertAlmostEqual(model.predict("m", costmodel.Layout(1, 2, 1)).compute_seconds, 2.0)

    def test_collective_overhead_is_paid_per_bucket(self):
        plain = costmodel.CostModel(calibration())
        watched = self.cal(collective_overhead_seconds=1e-3)
        for bucket_mb, count in ((0.0, 3), (1.0, 3), (64.0, 1)):  # gradients of 4, 1, 1 MiB
            lay = costmodel.Layout(2, 1, 1, "allreduce", bucket_mb)
            p, w = plain.predict("m", lay), watched.predict("m", lay)
            self.assertAlmostEqual(w.comm_seconds, p.comm_seconds + count * 1e-3)
            self.assertAlmostEqual(w.compute_seconds, p.compute_seconds)
        lay = costmodel.Layout(4, 2, 1, "hierarchical", 64.0)
        self.assertAlmostEqual(watched.predict("m", lay).comm_seconds,
                               plain.predict("m", lay).comm_seconds + 1e-3)
        self.assertEqual(watched.predict("m", costmodel.Layout(1, 1, 2)).comm_seconds, 0.0)

    def test_oversubscription(self):
        model = self.cal(oversubscription_slowdown=1.5)
        fits = model.predict("m", costmodel.Layout(1, 2, 1), cores=2)
        self.assertEqual(fits.slowdown, 1.0)
        # 2 ranks x 2 threads on 2 cores: one core per rank (one thread's compute), slowed 1.5x
        over = model.predict("m", costmodel.Layout(1, 2, 2), cores=2)
        self.assertAlmostEqual(over.compute_seconds, fits.compute_seconds)
        self.assertAlmostEqual(over.step_seconds, 1.5 * fits.step_seconds)
        # 2 x 4: two doublings past the cores
        over4 = model.predict("m", costmodel.Layout(1, 2, 4), cores=2)
        self.assertAlmostEqual(over4.step_seconds, 1.5 ** 2 * fits.step_seconds)
        # 1 rank x 4 threads on 2 cores: two threads' compute, one doubling
        one = model.predict("m", costmodel.Layout(1, 1, 4), cores=2)
        self.assertAlmostEqual(one.step_seconds, 1.5 * (2e-3 + 64e-3 / (2 * 0.5)))
        # the calibration's cores by default; no cores known: never oversubscribed
        cal = calibration(cores=2)
        cal["models"]["m"]["oversubscription_slowdown"] = 1.5
        self.assertEqual(costmodel.CostModel(cal).predict("m", costmodel.Layout(1, 2, 2)).slowdown,
                         1.5)
        self.assertEqual(model.predict("m", costmodel.Layout(1, 2, 2)).slowdown, 1.0)
        # best() fills its nodes' cores exactly, whatever the calibrated machine had
        best, options = costmodel.CostModel(cal).best("m", 4, 8)
        self.assertTrue(all(o.slowdown == 1.0 for o in options))

    def test_bad_terms_are_named(self):
        for key, value in (("collective_overhead_seconds", -1), ("oversubscription_slowdown", 0),
                           ("multi_rank_step_seconds", "x")):
            with self.assertRaisesRegex(costmodel.CalibrationError, f"'models.m.{key}' must be"):
                self.cal(**{key: value}).model("m")


class Calibration(unittest.TestCase):
    """scripts/calibrate-cost-model's fits of the measured terms, on made-up runs."""

    def test_multi_rank_terms(self):
        loader = importlib.machinery.SourceFileLoader(
            "calibrate", os.path.join(ROOT, "scripts", "calibrate-cost-model"))
        spec = importlib.util.spec_from_loader("calibrate", loader)
        cal_script = importlib.util.module_from_spec(spec)
        loader.exec_module(cal_script)
        cal = calibration(cores=2)
        m = cal["models"]["m"]
        m["measured"] = {}
        # the formula of 2 x 1 at the default buckets
        plain = costmodel.CostModel(calibration()).predict(
            "m", costmodel.Layout(1, 2, 1, "allreduce", cal_script.DEFAULT_BUCKET_MB), 64)
        runs = []

        def train(name, threads, batch, steps, metrics, save=None, ranks=1):
            runs.append((threads, ranks, batch))
            # every configuration's first run is disturbed (3x): the median of the runs counts
            slow = 3.0 if runs.count(runs[-1]) == 1 else 1.0
            if threads == 1:  # 2 x 1: 10 ms more compute, 3x the formula's communication
                t = plain.compute_seconds + 10e-3 + 3 * plain.comm_seconds
                return {"steps": 10, "epoch_seconds": 10 * t * slow,
                        "comm_seconds": 10 * 2 * plain.comm_seconds * slow,
                        "wait_seconds": 10 * plain.comm_seconds}, {}
            t = 1.7 * (plain.compute_seconds + 10e-3 + 3 * plain.comm_seconds)  # 2 x 2
            return {"steps": 10, "epoch_seconds": 10 * t * slow}, {}
        cal_script.train = train
        with unittest.mock.patch("os.cpu_count", return_value=2):
            cal_script.measure_multi_rank("m", cal, "/nonexistent")
        runs_each = cal_script.RUNS
        self.assertEqual(runs, [(1, 2, 64)] * runs_each + [(2, 2, 64)] * runs_each)
        self.assertAlmostEqual(m["multi_rank_step_seconds"], 10e-3)
        # twice the formula's communication beyond it, over 3 buckets (each gradient alone)
        count = len(costmodel.buckets(m["gradient_bytes"], cal_script.DEFAULT_BUCKET_MB * MB))
        self.assertEqual(count, 3)
        self.assertAlmostEqual(m["collective_overhead_seconds"], 2 * plain.comm_seconds / count)
        self.assertAlmostEqual(m["oversubscription_slowdown"], 1.7)
        model = costmodel.CostModel(cal)
        for threads, factor in ((1, 1.0), (2, 1.7)):
            p = model.predict("m", costmodel.Layout(1, 2, threads, "allreduce",
                                                    cal_script.DEFAULT_BUCKET_MB), 64)
            self.assertAlmostEqual(p.step_seconds, factor * (plain.compute_seconds + 10e-3 +
                                                             3 * plain.comm_seconds))


class Files(unittest.TestCase):
    def test_platform_files(self):
        star = os.path.join(ROOT, "scripts", "platforms", "ethernet-10g-star.xml")
        alpha, beta = costmodel.platform_network(star)
        self.assertAlmostEqual(alpha, 100e-6)  # two 50 us links
        self.assertAlmostEqual(beta, 8 / 10e9)
        tree = os.path.join(ROOT, "scripts", "platforms", "ethernet-100g-fattree.xml")
        alpha, beta = costmodel.platform_network(tree)
        self.assertAlmostEqual(alpha, 4 * 0.75e-6)
        self.assertAlmostEqual(beta, 8 / 100e9)

    def test_quantities(self):
        self.assertAlmostEqual(costmodel._quantity("1.25GBps", "bw", "f"), 1.25e9)
        self.assertAlmostEqual(costmodel._quantity("1GiBps", "bw", "f"), 2.0**30)
        self.assertAlmostEqual(costmodel._quantity("2ms", "lat", "f"), 2e-3)
        with self.assertRaisesRegex(costmodel.CalibrationError, "f: cannot read the bw 'fast'"):
            costmodel._quantity("fast", "bw", "f")

    def test_bad_calibrations_name_file_and_key(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.json")
            with open(path, "w") as f:
                f.write("{not json")
            with self.assertRaisesRegex(costmodel.CalibrationError, "c.json: not JSON"):
                costmodel.load(path)
            cal = calibration()
            del cal["shm"]["beta"]
            with open(path, "w") as f:
                json.dump(cal, f)
            with self.assertRaisesRegex(costmodel.CalibrationError, "missing 'shm.beta'"):
                costmodel.load(path)
            with open(path, "w") as f:
                json.dump(calibration(), f)
            with self.assertRaisesRegex(costmodel.CalibrationError,
                                        "no calibration of model 'x' \\(calibrated: m\\)"):
                costmodel.load(path).model("x")
        with self.assertRaisesRegex(costmodel.CalibrationError, "cannot read the calibration"):
            costmodel.load("/nonexistent/c.json")

    def test_cost_model_script(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.json")
            with open(path, "w") as f:
                json.dump(calibration(), f)
            script = os.path.join(ROOT, "scripts", "cost-model")
            out = subprocess.run([script, "m", "--calibration", path, "--nodes", "1,4",
                                  "--cores-per-node", "4"], stdout=subprocess.PIPE, text=True,
                                 check=True).stdout
            self.assertIn("4 node(s) of 4 core(s): pick", out)
            one = subprocess.run([script, "m", "--calibration", path, "--layout", "1x1"],
                                 stdout=subprocess.PIPE, text=True, check=True).stdout
            self.assertIn(f"| 1 | 1 | 1 | allreduce | 0.25 | 66.000 | 0.000 | "
                          f"{100 * 66e-3:.3f} | 0% |", one)
            bad = subprocess.run([script, "m", "--calibration", path, "--nodes", "0"],
                                 stderr=subprocess.PIPE, text=True)
            self.assertEqual(bad.returncode, 2)
            self.assertEqual(bad.stderr.strip(), "cost-model: error: --nodes takes positive "
                             "integers separated by commas, got '0'")


class SimulateCluster(unittest.TestCase):
    """scripts/simulate-cluster's memory guard: a run estimated over 90% of the available memory
    is skipped, from the per-rank growth of the runs done."""

    def setUp(self):
        import importlib.machinery
        import importlib.util
        path = os.path.join(ROOT, "scripts", "simulate-cluster")
        loader = importlib.machinery.SourceFileLoader("simulate_cluster", path)
        spec = importlib.util.spec_from_loader("simulate_cluster", loader)
        self.sc = importlib.util.module_from_spec(spec)
        loader.exec_module(self.sc)

    def run_of(self, ranks, batch, peak=None):
        r = self.sc.Run("strong", ranks, 1, batch, "")
        r.peak_mb = peak
        return r

    def test_skips_what_would_not_fit(self):
        done = [self.run_of(1, 1024, 800.0), self.run_of(256, 1024, 800.0 + 255 * 24)]
        self.sc.available_mb = lambda: 20 * 1024.0
        why = self.sc.too_big(self.run_of(1024, 1024), done)
        self.assertRegex(why, r"^about 24\.8 GB estimated from the 256-rank run's peak, "
                              r"20\.0 GB available$")
        self.assertEqual(self.sc.too_big(self.run_of(512, 1024), done), "")  # 12.8 GB fits

    def test_needs_two_runs_to_estimate(self):
        self.sc.available_mb = lambda: 1.0
        self.assertEqual(self.sc.too_big(self.run_of(1024, 1024),
                                         [self.run_of(1, 1024, 800.0)]), "")


if __name__ == "__main__":
    unittest.main()
