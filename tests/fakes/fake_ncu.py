"""A stand-in for Nsight Compute's `ncu` CLI, for CPU tests of advisor.run.counters.

    --query-metrics             prints base metric names (FAKE_NCU_HIDE: comma list to omit)
    ... --export R ... TARGET   runs TARGET on the CPU (adds --device cpu), then writes R with
                                the requested metrics; FAKE_NCU_REJECT: a metric to refuse
                                the way ncu does ("==ERROR== Failed to find metric ...")
    --import R --csv --page raw prints R's kernels in ncu's raw CSV layout
"""

import json
import os
import subprocess
import sys

args = sys.argv[1:]
if "--query-metrics" in args:
    hide = set(filter(None, os.environ.get("FAKE_NCU_HIDE", "").split(",")))
    print("Device NVIDIA FAKE (GH100)\n----\nMetric Name                         Metric Description")
    for i in range(30):
        print(f"filler__metric_{i}   a filler metric")
    for base in ["gpu__time_duration", "sm__pipe_tensor_op_gmma_cycles_active", "sm__pipe_tensor_op_hmma_cycles_active",
                 "sm__throughput", "sm__cycles_active", "sm__cycles_elapsed", "dram__throughput", "dram__bytes_read",
                 "dram__bytes_write", "sm__warps_active", "sm__maximum_warps_per_active_cycle_pct"]:
        if base not in hide:
            print(f"{base}   description of {base}")
    sys.exit(0)

if "--import" in args:
    rep = json.load(open(args[args.index("--import") + 1]))
    metrics = rep["metrics"]
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size", "Grid Size",
            "Device", "CC"] + metrics
    units = {"gpu__time_duration.sum": "nsecond", "dram__bytes_read.sum": "byte", "dram__bytes_write.sum": "byte"}
    q = lambda xs: ",".join('"' + str(x) + '"' for x in xs)  # noqa: E731
    print("==PROF== Connected to process")
    print(q(head))
    print(q([""] * 11 + [units.get(m, "%" if "pct" in m else "") for m in metrics]))
    for i, (name, t) in enumerate(rep["kernels"]):
        vals = {"gpu__time_duration.sum": f"{t:,}", "dram__bytes_read.sum": "1,048,576", "dram__bytes_write.sum": "524,288",
                "launch__waves_per_multiprocessor": "1.08", "launch__grid_size": "143", "launch__block_size": "256",
                "launch__registers_per_thread": "168", "sm__cycles_active.avg": "900", "sm__cycles_elapsed.avg": "1,000"}
        row = [i, 4242, "python3", "127.0.0.1", name, 1, 7, "(256, 1, 1)", "(143, 1, 1)", 0, "9.0"]
        row += [vals.get(m, "50.5") for m in metrics]
        print(q(row))
    sys.exit(0)

metrics = args[args.index("--metrics") + 1].split(",")
reject = os.environ.get("FAKE_NCU_REJECT")
if reject and reject in metrics:
    print(f"==ERROR== Failed to find metric {reject}", file=sys.stderr)
    sys.exit(1)
report = args[args.index("--export") + 1]
target = args[args.index("--force-overwrite") + 1:]
p = subprocess.run(target + ["--device", "cpu"], capture_output=True, text=True)
if p.returncode != 0:
    print(p.stdout + p.stderr, file=sys.stderr)
    print("==ERROR== The application returned an error code (1).", file=sys.stderr)
    sys.exit(1)
provider = target[target.index("--provider") + 1]
kernels = [["<b>evil|kernel`</b>" if provider == "split_k" else f"{provider}_kernel", 80_000]]
if provider == "split_k":
    kernels.append(["split_k_reduce", 20_000])
json.dump({"metrics": metrics, "kernels": kernels}, open(report, "w"))
print(f"==PROF== Report: {report}")
