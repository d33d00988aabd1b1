"""The `advisor` command: thin click wrappers over the library API.

Every command turns an `AdvisorError` into one line on stderr and exit code 2; anything else
is a bug and keeps its traceback. Options can also come from the environment:
ADVISOR_SM_COUNT and ADVISOR_CACHE_DIR for every command that takes them, any other option
as ADVISOR_<COMMAND>_<OPTION> named after its flag (e.g. ADVISOR_DIAGNOSE_TOP=3,
ADVISOR_DIAGNOSE_JSON=1, ADVISOR_DIAGNOSE_OUT=report), except the options that run code
(--run, --counters), which must be typed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from . import __version__
from .basics import COMM_OVERLAP, COMM_PATTERNS, DEFAULT_SM_COUNT, DTYPES, GEMM_STRATEGIES, GROUPED, SPLIT_KV, parse_shape
from .errors import AdvisorError
from .textutil import safe_text


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except AdvisorError as exc:
            click.echo(f"advisor: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except BrokenPipeError:
            # The reader of our output went away (`advisor rules | head -1`): not an error.
            # Point stdout at /dev/null so the interpreter's final flush cannot fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(0)
        except OSError as exc:
            # The file system refused something (an --out or -o path that cannot be created,
            # a full disk): the user's to fix, so one line and exit 2 like any AdvisorError.
            where = f"{exc.filename}: " if exc.filename else ""
            err = AdvisorError(f"cannot write or read {where}{exc.strerror or exc}")
            click.echo(f"advisor: error: {err}", err=True)
            ctx.exit(err.exit_code)


class _Option(click.Option):
    """An option that also reads ADVISOR_<COMMAND>_<OPTION> named after its flag (--json ->
    ADVISOR_DIAGNOSE_JSON, --out -> ADVISOR_DIAGNOSE_OUT), as the README says, where click alone
    would take the Python parameter's name (as_json, out_dir); that name keeps working."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        rv = super().resolve_envvar_value(ctx)
        if rv is not None or not self.allow_from_autoenv or ctx.auto_envvar_prefix is None:
            return rv
        flag = next((o for o in self.opts if o.startswith("--")), None)
        if flag is None:
            return None
        return os.environ.get(f"{ctx.auto_envvar_prefix}_{flag[2:].replace('-', '_').upper()}") or None


def _option(*decls, **attrs):
    return click.option(*decls, cls=_Option, **attrs)


def _echo_json(obj) -> None:
    from .report.write import json_text

    click.echo(json_text(obj))


def _stdout_is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


def _echo_markdown(markdown: str) -> None:
    """A report on stdout: markdown as written to report.md when piped or redirected (for pull
    requests and agents), without its backslash escapes when a person reads it on a terminal."""
    if _stdout_is_tty():
        from .textutil import md_for_terminal

        markdown = md_for_terminal(markdown)
    click.echo(markdown, nl=False)


trace_args = click.argument(
    "traces", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=True)
)
sm_count_opt = _option(
    "--sm-count",
    type=click.IntRange(1, 4096),
    default=None,
    envvar="ADVISOR_SM_COUNT",
    show_envvar=True,
    help="SMs (NVIDIA) or CUs (AMD) of the profiled GPU, for traces that do not record it.",
)
unrelated_opt = _option(
    "--allow-unrelated",
    is_flag=True,
    help="Read several files even when they are not the ranks of one run (same content twice, a rank declared "
         "twice, different GPU models, clocks that never meet): each is judged on its own, with a note, and no "
         "cross-rank figure (waits, slowest rank, critical path). Without it such files are an error.",
)
cache_opt = _option(
    "--cache-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    envvar="ADVISOR_CACHE_DIR",
    show_envvar=True,
    help="Where .nsys-rep files are exported to SQLite (default: ~/.cache/advisor).",
)


def _size(ctx, param, value):
    if value is None:
        return None
    from .traces._inflate import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


inflate_opt = _option(
    "--max-inflated-bytes",
    default=None,
    metavar="SIZE",
    callback=_size,
    envvar="ADVISOR_MAX_INFLATED_BYTES",
    show_envvar=True,
    help="Refuse a gzip trace that inflates to more than SIZE (bytes, or e.g. 16G) [default: 4G]: "
         "a 5 MiB gzip bomb can hold 6 GiB.",
)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "ADVISOR"})
@click.version_option(__version__, prog_name="advisor")
def cli() -> None:
    """Turn a GPU profiler timeline into measured kernel-scheduling improvements.

    \b
    Typical flow:
      advisor summary trace.nsys-rep        what the trace holds
      advisor diagnose trace.nsys-rep       findings: symptom -> strategy, ranked by time
      advisor rules                         the symptom-to-strategy matrix in use

    Traces: Nsight Systems (.nsys-rep or its SQLite export), PyTorch profiler / Kineto JSON
    (.json, .json.gz), rocprof v1/v2/v3 CSV, rocprofv3 JSON, rocpd SQLite. Pass one file per
    rank to read a multi-GPU run together.
    """


@cli.command("summary")
@trace_args
@_option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_option("--top", type=click.IntRange(1, 1000), default=10, show_default=True, help="Kernels to list.")
@sm_count_opt
@unrelated_opt
@cache_opt
@inflate_opt
def summary_command(traces, as_json, top, sm_count, allow_unrelated, cache_dir, max_inflated_bytes) -> None:
    """Say what TRACES hold: format, devices, kernels, top kernels by time, NVTX, copies."""
    from .report.summary import summarize
    from .traces import load_trace

    trace = load_trace(traces, sm_count=sm_count, cache_dir=cache_dir, max_inflated_bytes=max_inflated_bytes,
                       allow_unrelated=allow_unrelated)
    info = summarize(trace, top=top)
    if as_json:
        _echo_json(info)
        return
    from .report.write import summary_text

    click.echo(summary_text(info), nl=False)


rules_opt = _option(
    "--rules",
    "rules_dir",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    default=None,
    help="Directory of rule TOML files to use instead of the bundled matrix (copy rules/ and edit).",
)


def example_trace() -> Path:
    """The real trace bundled with advisor (H200, planted symptoms)."""
    from .resources import examples_dir

    return examples_dir() / "h200_planted_mixed.sqlite.gz"


# Options that compile and run code (generated variants, the profiler on them) are never taken
# from the environment: ADVISOR_DIAGNOSE_RUN=1 left in a CI or shell environment would turn a
# read-only diagnosis of someone's trace into running code on this host's GPU.
RUNS_CODE = {"allow_from_autoenv": False}

counters_opt = _option(
    "--counters", is_flag=True, **RUNS_CODE,
    help="After timing, profile one call of each verified provider under Nsight Compute (ncu) and report the "
         "counters that explain the result: tensor-pipe activity, SM busy, achieved occupancy, waves per SM, DRAM "
         "throughput and traffic, L2 throughput. Needs ncu (PATH, $NCU or a standard install); skipped with a note otherwise.")


@cli.command("diagnose")
@click.argument("traces", nargs=-1, type=click.Path(path_type=Path))
@_option("--example", is_flag=True,
              help="Diagnose the bundled example: a real H200 trace with planted symptoms (no GPU needed).")
@_option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON (the agents' contract) instead of markdown.")
@_option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Also write report.md, report.json and waves.png (with matplotlib) into this directory; with --run "
                   "also run_report.md/json and the variant files.")
@_option("--top", type=click.IntRange(1, 10000), default=None, help="Keep only the N findings with the most recoverable time.")
@_option("--run", "run_variants", is_flag=True, **RUNS_CODE,
              help="Then, for each finding with a GEMM shape, generate, verify and time the candidate schedules on this GPU "
                   "(without a GPU: only generate the files) and write a before/after report into --out (default: ./advisor-run).")
@_option("--budget-s", type=click.FloatRange(5, 3600), default=60, show_default=True,
              help="With --run: seconds of GPU time per shape (compile time counts).")
@_option("--shape", "shapes", multiple=True, metavar="KERNEL_PATTERN=MxNxK[:dtype]",
         help="A GEMM shape the trace does not record, for the kernels whose names match the regular expression "
              "KERNEL_PATTERN (e.g. --shape 'dp_gemm=1664x1408x8192:bf16'). Repeatable; the first match wins; "
              "the findings, their Next: commands and --run use it.")
@counters_opt
@rules_opt
@sm_count_opt
@unrelated_opt
@cache_opt
@inflate_opt
def diagnose_command(traces, example, as_json, out_dir, top, run_variants, budget_s, shapes, counters, rules_dir,
                     sm_count, allow_unrelated, cache_dir, max_inflated_bytes) -> None:
    """Find where work maps badly onto the GPU's SMs and name the strategy to try.

    Reads TRACES (one file, or one per rank), computes the symptoms (tail waves, under-filled
    grids with long K, launch overhead, Hopper GEMMs without warp specialization, exposed
    communication), applies the symptom-to-strategy matrix (see `advisor rules`) and prints
    findings ranked by estimated recoverable GPU time, with the evidence in numbers. Basic
    problems (idle GPU, synchronising calls, host copies, GEMMs far under their roofline) are
    listed first: while they dominate, scheduling work is premature.

    \b
    Examples:
      advisor diagnose --example
      advisor diagnose run.nsys-rep
      advisor diagnose rank0.json.gz rank1.json.gz --json --top 5
      advisor diagnose trace.sqlite --sm-count 132 --out report/
      advisor diagnose trace.json.gz --shape 'cutlass.*gemm=4096x4096x8192:bf16'
      advisor diagnose run.nsys-rep --run --counters --out report/   (on a GPU)
    """
    from .diagnose.diagnosis import diagnose
    from .traces import load_trace

    if example:
        if traces:
            raise click.UsageError("give trace files or --example, not both")
        traces = (example_trace(),)
    if not traces:
        raise click.UsageError("give at least one trace file (or --example for the bundled one)")
    if counters and not run_variants:
        raise click.UsageError("--counters profiles the variants that --run measures: add --run")
    trace = load_trace(traces, sm_count=sm_count, cache_dir=cache_dir, max_inflated_bytes=max_inflated_bytes,
                       allow_unrelated=allow_unrelated)
    result = diagnose(trace, rules=rules_dir, top=top, shapes=list(shapes))
    if out_dir is not None:
        from .report.write import write_diagnosis

        markdown = write_diagnosis(result, out_dir)
        click.echo(f"wrote {out_dir / 'report.md'} and {out_dir / 'report.json'}", err=True)
    elif not as_json:  # --json alone needs no markdown (nor jinja2)
        from .report.write import diagnosis_markdown

        markdown = diagnosis_markdown(result)
    if as_json:
        _echo_json(result.to_dict())
    else:
        _echo_markdown(markdown)
    if run_variants:
        from .run.loop import loop_findings

        run_dir = out_dir or Path("advisor-run")
        skipped: list = []
        results = loop_findings(result, budget_s=budget_s, out_dir=run_dir, progress_for=_progress_bar,
                                counters=counters, log=_log, skipped=skipped)
        for s in skipped:
            _log(f"--run: skipped {s.symptom}: {s.reason}")
        if not results:
            if skipped:
                n = len(skipped)
                _log(f"--run: nothing run here ({n} finding{'s' if n > 1 else ''} skipped, for the reasons above)")
            else:
                _log("--run: no finding with a GEMM shape and a GEMM strategy to run")
            return
        # with --json, stdout stays the one JSON document; the run's report is in run_dir
        _write_run_report(results, run_dir, rules=result.rules, skipped=skipped, echo=not as_json)


def _log(msg: str) -> None:
    click.echo(f"advisor: {msg}", err=True)


def _progress_bar(label: str):
    """A progress callback that draws a click bar over the shape's time budget."""
    state = {"bar": None}

    def update(p) -> None:
        if state["bar"] is None:
            state["bar"] = click.progressbar(length=1000, label=f"{label}", file=sys.stderr, show_eta=False)
            state["bar"].__enter__()
        bar = state["bar"]
        done = int(1000 * min(1.0, p.elapsed_s / max(p.budget_s, 1e-9)))
        if done > bar.pos:
            bar.update(done - bar.pos)

    def close() -> None:  # idempotent: the loop closes the bar before collecting counters
        if state["bar"] is not None:
            state["bar"].__exit__(None, None, None)
            state["bar"] = None

    update.close = close  # type: ignore[attr-defined]
    return update


def _write_run_report(results, out_dir: Path, rules=None, skipped=(), echo: bool = True) -> None:
    from .run.loop import write_run_report

    md = write_run_report(results, out_dir, rules=rules, skipped=skipped)
    if echo:
        _echo_markdown(md)
    click.echo(f"advisor: wrote {out_dir / 'run_report.md'} and run_report.json", err=True)


@cli.command("bench")
@_option("--shape", "shapes", required=True, multiple=True, help="GEMM MxNxK to benchmark (repeatable).")
@_option("--dtype", type=click.Choice(list(DTYPES)), default="bf16", show_default=True)
@_option("--strategies", default="split_k,stream_k,persistent,warp_specialization", show_default=True,
              help="Comma-separated strategies to time against torch.matmul and our data-parallel baseline.")
@_option("--budget-s", type=click.FloatRange(5, 3600), default=60, show_default=True,
              help="Seconds of GPU time per shape, compile time included.")
@_option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("advisor-bench"),
              show_default=True, help="Directory for rows.csv/json, run_report.md/json and the winning variants.")
@counters_opt
def bench_command(shapes, dtype, strategies, budget_s, out_dir, counters) -> None:
    """Time and verify GEMM schedules on this GPU for one or more shapes.

    For each shape: torch.matmul (cuBLAS) and our data-parallel baseline, then each strategy's
    candidates in the analytical model's order until the budget runs out. Every candidate is
    checked (fresh random inputs, NaN-poisoned output, float64 reference) before it is timed;
    one that fails to compile, crashes, hangs or is wrong is reported and never wins. The
    winner's variant file is written to --out with its knobs baked in. Without a GPU it only
    generates the files and says how to run them.

    \b
    Example:
      advisor bench --shape 1664x1408x8192 --strategies stream_k,persistent --budget-s 90
      advisor bench --shape 128x8192x8192 --strategies split_k --counters
    """
    from .run.loop import run_shape_loop

    chosen = [s.strip() for s in strategies.split(",") if s.strip()]
    bad = [s for s in chosen if s not in GEMM_STRATEGIES or s == "dp"]
    if bad or not chosen:
        raise click.BadParameter(f"unknown strategies {bad}; choose from split_k, stream_k, persistent, warp_specialization"
                                 + (" (dp, the data-parallel baseline, always runs)" if "dp" in bad else ""),
                                 param_hint="--strategies")
    results = []
    for text in shapes:
        M, N, K = parse_shape(text)
        bar = _progress_bar(f"{M}x{N}x{K}")
        try:
            results.append(run_shape_loop(M, N, K, dtype, chosen, budget_s=budget_s, out_dir=out_dir, progress=bar,
                                          counters=counters, log=_log))
        finally:
            bar.close()
    _write_run_report(results, out_dir)


@cli.command("rules")
@rules_opt
@_option("--json", "as_json", is_flag=True, help="Print the matrix as JSON.")
def rules_command(rules_dir, as_json) -> None:
    """Print the symptom-to-strategy matrix and every threshold with the reason for its value."""
    from .diagnose.diagnosis import rules_table
    from .rules import load_rules

    table = rules_table(load_rules(rules_dir))
    if as_json:
        _echo_json(table)
        return
    from .report.write import rules_text

    click.echo(rules_text(table), nl=False)


def _parse_knobs(pairs) -> dict:
    knobs = {}
    for item in pairs:
        if "=" not in item:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE, e.g. SPLIT_K=8", param_hint="--config")
        key, value = item.split("=", 1)
        knobs[key.strip()] = value.strip()
    return knobs


@cli.command("generate")
@click.argument("strategy", type=click.Choice([*GEMM_STRATEGIES, GROUPED, COMM_OVERLAP, SPLIT_KV]))
@_option("--shape", default=None, help="Problem size MxNxK, e.g. 256x256x131072 (required, except for grouped and split_kv).")
@_option("--attn", default=None, metavar="B:HQ:HKV:D:S[:LQ]",
              help="split_kv only: decode attention with batch B, HQ query heads, HKV kv heads, head_dim D, KV length S "
                   "and LQ query positions (default 1), e.g. 1:32:8:128:32768.")
@_option("--group", default=None, metavar="COUNT:LO:HI[:SEED]",
              help="grouped only: COUNT GEMMs whose M, N, K are drawn in LO..HI on multiples of 8 with SEED (default 0), "
                   "as bench/bench_gemm.py --grouped draws them, e.g. 64:128:512:0.")
@_option("--shapes", default=None, metavar="MxNxK,...",
              help="grouped only: the GEMMs listed (after the --group ones when both are given), e.g. 17x33x70,64x48x128.")
@_option("--dtype", type=click.Choice(list(DTYPES)), default="bf16", show_default=True)
@_option("--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="Override one knob of the schedule's Config (repeatable), e.g. --config SPLIT_K=8.")
@_option("--sm-count", type=click.IntRange(1, 4096), default=DEFAULT_SM_COUNT, show_default=True, envvar="ADVISOR_SM_COUNT",
              show_envvar=True, help="SMs of the target GPU, for the model that picks the knobs (132 = H100/H200 SXM).")
@_option("--pattern", type=click.Choice(COMM_PATTERNS), default="all_gather_matmul",
              show_default=True, help="comm_overlap only: which tensor-parallel GEMM pattern to overlap.")
@_option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Where to write the variant (a standalone .py file).")
def generate_command(strategy, shape, attn, group, shapes, dtype, configs, sm_count, pattern, output) -> None:
    """Write a standalone Triton variant of STRATEGY for one GEMM shape (or one group of GEMMs).

    The file holds the schedule's kernel (inlined from advisor's kernels/), its knobs baked in
    as a Config (chosen by the analytical model unless you pass --config), a launcher, a
    correctness check and a benchmark. Run it with `python FILE --check` / `--bench`, or
    import `variant_matmul` (grouped: `variant_grouped_matmul`) from it.

    \b
    Strategies: dp (data-parallel baseline), split_k, persistent, stream_k,
    warp_specialization (Hopper TMA + warp specialization), cluster_gemm (Gluon,
    Triton >= 3.9: 2-CTA clusters with TMA multicast, sm_90), grouped (many
    independent GEMMs in one persistent launch; takes --group COUNT:LO:HI[:SEED]
    and/or --shapes MxNxK,... instead of --shape; knobs from the schedule's
    default_config for the group; --bench times it against a Python loop of
    torch.matmul and that loop in a CUDA graph), comm_overlap (a torchrun
    script overlapping the collective of a tensor-parallel GEMM with its
    compute; --pattern picks all-gather + GEMM or GEMM + reduce-scatter;
    knobs: chunks, ...), split_kv (decode attention split over the KV
    sequence, flash-decoding; takes --attn B:HQ:HKV:D:S[:LQ]; --bench times it
    against torch SDPA's flash, cuDNN, efficient and math backends).

    \b
    Example:
      advisor generate split_k --shape 256x256x131072 --dtype bf16 -o variant.py
      advisor generate grouped --group 64:128:512:0 --dtype bf16 -o grouped.py
      advisor generate split_kv --attn 1:32:8:128:32768 --dtype bf16 -o decode.py
    """
    from .codegen.generate import write_variant

    w = write_variant(strategy, output, shape=shape, attn=attn, group=group, shapes=shapes, dtype=dtype,
                      knobs=_parse_knobs(configs), sm_count=sm_count, pattern=pattern)
    for line in w.warnings:
        _log(f"warning: {line}")
    for line in w.lines:
        click.echo(line)


@cli.command("profile", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("advisor-profile"),
              show_default=True, help="Directory for the trace and the report.")
@_option("--kineto", is_flag=True, help="Use the PyTorch profiler even when nsys is available.")
@_option("--top", type=click.IntRange(1, 10000), default=None, help="Keep only the N findings with the most recoverable time.")
@_option("--use", "use_sources", multiple=True, type=click.Path(path_type=Path, exists=True),
         help="Run COMMAND with advisor.use routing its matching GEMMs to these verified variants: a RUN_DIR of "
              "`advisor diagnose --run`, or variant files (repeatable). Python programs only (a sitecustomize on "
              "PYTHONPATH enters the routing); the report says how many calls each variant took.")
@rules_opt
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def profile_command(out_dir, kineto, top, use_sources, rules_dir, command) -> None:
    """Run COMMAND under a profiler, then diagnose the trace it wrote.

    Uses Nsight Systems when `nsys` is found (PATH, $NSYS, standard install dirs), else the
    PyTorch profiler for Python programs. Writes the trace, report.md and report.json into
    --out and prints the report. With --use, the program's torch.matmul / mm / addmm /
    nn.functional.linear (and @) calls whose shape, dtype and layout match a verified
    variant run on it, everything else on torch; compare the two profiles with
    `advisor compare`.

    \b
    Examples:
      advisor profile -- python train.py --steps 20
      advisor profile --kineto --out prof/ -- python -m mypkg.bench
      advisor profile --use advisor-run --out prof-after -- python train.py
    """
    from .diagnose.diagnosis import diagnose
    from .report.write import write_diagnosis
    from .run.profile import profile
    from .traces import load_trace

    def log(msg):
        click.echo(f"advisor: {msg}", err=True)

    env = None
    if use_sources:
        from .run.use import routing_env

        env = routing_env(use_sources, out_dir)
    result = profile(list(command), out_dir, prefer="kineto" if kineto else "auto", log=log, env=env)
    if use_sources:
        from .run.use import routed_calls

        calls = routed_calls(out_dir)
        log("routed: " + (", ".join(f"{safe_text(k)} {v} call(s)" for k, v in sorted(calls.items())) or
                          "no call matched a variant"))
    if result.returncode != 0:
        log(f"the program exited with code {result.returncode}; diagnosing what was recorded")
    trace = load_trace([result.trace], cache_dir=out_dir)
    markdown = write_diagnosis(diagnose(trace, rules=rules_dir, top=top), out_dir, waves=False)
    log(f"trace: {result.trace}; report: {out_dir / 'report.md'}")
    _echo_markdown(markdown)


@cli.command("optimize", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("advisor-optimize"),
         show_default=True, help="Directory for everything: before/, run/, after/, compare.md/json, report.md/json.")
@_option("--budget-s", type=click.FloatRange(5, 3600), default=60, show_default=True,
         help="Seconds of GPU time per GEMM shape for verifying and timing the variants (compile time counts).")
@_option("--kineto", is_flag=True, help="Use the PyTorch profiler even when nsys is available (both runs).")
@rules_opt
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def optimize_command(out_dir, budget_s, kineto, rules_dir, command) -> None:
    """Profile COMMAND, fix what can be fixed without editing it, and measure the change.

    Profiles the program, diagnoses it, generates, verifies and times the candidate
    schedules for each finding with a GEMM shape (as `diagnose --run`), runs the program
    again under the same profiler with the verified winners routed in by advisor.use, and
    compares the two profiles (`advisor compare`). Writes report.md/json into --out: the
    findings, what was applied and how many calls it took, the measured end-to-end change
    against the diagnosis' estimate, and the code change to make for advice that is not a
    kernel swap (CUDA graph, grouped GEMMs, comm overlap, padding an odd dimension, fusion,
    channels_last, dtype). Mark your steps (torch.profiler's schedule, or a
    record_function/NVTX range named "step") so that warm-up and compilation stay out of
    the comparison. Without a GPU nothing is verified: the report lists the findings and
    code changes, and the program runs once.

    \b
    Examples:
      advisor optimize -- python train.py --steps 20
      advisor optimize --budget-s 120 --kineto --out opt/ -- python -m mypkg.step
    """
    from .run.optimize import optimize

    res = optimize(list(command), out_dir, budget_s=budget_s, prefer="kineto" if kineto else "auto", rules=rules_dir,
                   log=_log, progress_for=_progress_bar)
    _log(f"wrote {out_dir / 'report.md'} and report.json")
    _echo_markdown((out_dir / "report.md").read_text(encoding="utf-8"))
    if res.comparison is not None:
        _log(f"end to end: {res.comparison.verdict} ({res.comparison.why})")


def _side_files(positional: str | None, repeated: tuple[Path, ...], which: str) -> list[Path]:
    """One side's trace files: the positional argument (one file, or a comma-separated list of
    per-rank files) or the repeated --before/--after options, not both."""
    if positional is not None and repeated:
        raise click.UsageError(f"give the {which} side as an argument or as --{which} options, not both")
    if repeated:
        return list(repeated)
    if positional is None:
        raise click.UsageError(f"no {which} trace: advisor compare BEFORE AFTER (or --{which} FILE, repeated per rank)")
    if Path(positional).exists() or "," not in positional:
        return [Path(positional)]
    return [Path(p) for p in positional.split(",") if p]


@cli.command("compare")
@click.argument("before", required=False)
@click.argument("after", required=False)
@_option("--before", "before_files", multiple=True, type=click.Path(path_type=Path),
         help="A trace of the before side (repeat once per rank); instead of the BEFORE argument.")
@_option("--after", "after_files", multiple=True, type=click.Path(path_type=Path),
         help="A trace of the after side (repeat once per rank); instead of the AFTER argument.")
@_option("--json", "as_json", is_flag=True, help="Print the comparison as JSON (the agents' contract) instead of markdown.")
@_option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
         help="Also write compare.md and compare.json into this directory.")
@_option("--top", type=click.IntRange(1, 1000), default=15, show_default=True, help="Kernels to list in the markdown.")
@_option("--fail-on-regression", "fail_pct", type=click.FloatRange(0, 1000), default=None, metavar="PCT",
         help="Exit 1 when the verdict is `slower` by more than PCT percent (CI gate); exit 2 when the traces are "
              "not comparable.")
@rules_opt
@sm_count_opt
@cache_opt
def compare_command(before, after, before_files, after_files, as_json, out_dir, top, fail_pct, rules_dir, sm_count,
                    cache_dir) -> None:
    """Compare two profiles of one program: what a change did to its step time.

    BEFORE and AFTER are each one trace, or one file per rank as a comma-separated list
    (or repeat --before F / --after F). Formats may differ (an nsys export before, a
    PyTorch profiler trace after). Each side is cut into steps: Kineto ProfilerStep#N
    ranges, else NVTX or record_function ranges named like a step ("step", "train_step 3",
    "iteration"), else the whole capture. Reports per-step wall time, GPU busy time, GPU
    time by kind of work (GEMM, attention, communication, copies, reductions,
    elementwise), per-kernel changes (GEMMs matched by shape, others by name family), the
    findings resolved, new and remaining, and a verdict: faster, slower, same (inside the
    noise the traces show: the spread of per-step times, or of repeated launches of one
    kernel when a side has a single step) or not_comparable (different GPUs, rank counts
    or programs, with why). Sides from different profilers are judged on GPU busy time.

    \b
    Examples:
      advisor compare before.nsys-rep after.json.gz
      advisor compare r0.sqlite,r1.sqlite r0_after.json.gz,r1_after.json.gz --json
      advisor compare --before base.json.gz --after pr.json.gz --fail-on-regression 5
    """
    from .report.compare import compare, regression_exceeds
    from .report.write import comparison_markdown, write_comparison
    from .traces import load_trace

    b_files = _side_files(before, before_files, "before")
    a_files = _side_files(after, after_files, "after")
    tb = load_trace(b_files, sm_count=sm_count, cache_dir=cache_dir)
    ta = load_trace(a_files, sm_count=sm_count, cache_dir=cache_dir)
    result = compare(tb, ta, rules=rules_dir)
    payload = result.to_dict()
    markdown = ""
    if out_dir is not None:
        markdown = write_comparison(payload, out_dir, top=top)
        _log(f"wrote {out_dir / 'compare.md'} and {out_dir / 'compare.json'}")
    elif not as_json:
        markdown = comparison_markdown(payload, top)
    if as_json:
        _echo_json(payload)
    else:
        _echo_markdown(markdown)
    if fail_pct is not None:
        if result.verdict == "not_comparable":
            raise AdvisorError(f"cannot gate on a regression: the traces are not comparable ({result.why})")
        if regression_exceeds(result, fail_pct):
            _log(f"regression: {result.why}; more than the {fail_pct:g}% allowed")
            sys.exit(1)


def main() -> None:
    cli.main(prog_name="advisor")


if __name__ == "__main__":  # pragma: no cover
    main()
