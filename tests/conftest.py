"""Shared test setup.

Tests run on the CPU: Triton kernels execute under the interpreter (TRITON_INTERPRET=1 must
be set before triton is imported, hence here), with a small SM count so persistent and
Stream-K schedules really loop over several tiles. Set ADVISOR_TEST_GPU=1 to run the kernel
tests on a real GPU instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

if os.environ.get("ADVISOR_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("ADVISOR_NUM_SMS", "3")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def load_script(relpath: str) -> ModuleType:
    """A script of bench/ or experiments/ (folders of scripts, not packages) as a module,
    without putting its folder on sys.path for every later import."""
    path = REPO / relpath
    name = "_script_" + relpath.removesuffix(".py").replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def corpus_dir() -> Path:
    """../shared/corpus beside the checkout (ADVISOR_CORPUS overrides)."""
    env = os.environ.get("ADVISOR_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


@pytest.fixture
def corpus() -> Path:
    path = corpus_dir()
    if not path.is_dir():
        pytest.skip(f"reference corpus not found at {path}")
    return path


# The slowest tests of the default run (their parametrizations together over ~3.5 s on this
# 2-core machine, measured 2026-12-02 with --durations=0): interpreter-heavy kernel sweeps,
# fuzzers, whole-corpus diagnoses. They form the `slow` tier with the tests marked in place;
# .ci/run runs it after the README's fast tier, so every test still runs in CI. Each kernel
# keeps quicker interpreter tests in the fast tier.
SLOW_TESTS = frozenset({
    "tests/test_profile.py::test_profile_kineto_records_a_python_program",
    "tests/test_symptoms.py::test_real_runs_get_their_own_strategy_ids",
    "tests/test_split_k_gemm.py::test_reductions_dtypes",
    "tests/test_persistent_gemm.py::test_pointer_path",
    "tests/test_generate.py::test_generated_dp_variant_checks_under_interpreter",
    "tests/test_dp_gemm.py::test_odd_shapes_dtypes_layouts",
    "tests/test_compare.py::test_different_devices_from_the_corpus",
    "tests/test_split_kv_attention.py::test_dtypes_gqa4",
    "tests/test_bench_runner.py::test_budget_stops_the_loop_and_round_robin_shares_it",
    "tests/test_model_traces.py::test_decode_is_launch_bound_and_told_to_use_a_graph",
    "tests/test_bench_runner.py::test_run_grouped_baselines_and_a_partial_writer",
    "tests/test_cli_env.py::test_diagnose_help_names_every_file_it_writes",
    "tests/test_ws_gemm.py::test_ws_configs_match_reference",
    "tests/test_grouped_gemm.py::test_many_groups_of_mixed_odd_sizes",
    "tests/test_reader_rocprof.py::test_corpus_rocprofv3_json",
    "tests/test_cli_env.py::test_option_env_names_follow_the_option_not_its_python_name",
    "tests/test_hostile_inputs.py::test_trace_with_megabyte_names_diagnoses_in_seconds",
    "tests/test_attention_symptoms.py::test_h200_decode_trace_short_kv_is_no_finding",
    "tests/test_generate.py::test_comm_overlap_variant_without_torchrun_says_to_use_it",
    "tests/test_split_k_gemm.py::test_many_splits_small_tiles",
    "tests/test_packaging.py::test_wheel_contents",
    "tests/test_comm_overlap.py::test_decomposed_equals_plain",
    "tests/test_hostile_inputs.py::test_kineto_is_streamed_in_bounded_memory",
    "tests/test_unrelated_ranks.py::test_slowest_rank_only_when_aligned",
    "tests/test_h200x2_traces.py::test_mlp_block_overlapped_by_copy_engine_is_hidden",
    "tests/test_comm_strategy.py::test_dlrm_send_recv_is_its_all_to_all_and_mostly_waiting",
    "tests/test_generate.py::test_generated_persistent_staged_variant_on_misaligned_shape",
    "tests/test_h200x2_traces.py::test_bench_traces_plain_flagged_overlap_not",
    "tests/test_block_cost_probe.py::test_block_cost_probe_smoke",
    "tests/test_split_k_gemm.py::test_reductions_transposed_views",
    "tests/test_stream_k_gemm.py::test_split_unchunked_pieces_and_clean_scratch",
    "tests/test_stream_k_gemm.py::test_whole_pieces",
    "tests/test_bad_inputs.py::test_bad_input_through_the_cli",
    "tests/test_bad_inputs.py::test_fuzz_mutated_csv",
    "tests/test_bad_inputs.py::test_fuzz_mutated_sqlite",
    "tests/test_bad_inputs.py::test_fuzz_structured_kineto",
    "tests/test_bad_inputs.py::test_fuzz_structured_nsys",
    "tests/test_bad_inputs.py::test_fuzz_structured_rocprofv3",
    "tests/test_basics.py::test_healthy_traces_fire_no_basic_rule",
    "tests/test_basics.py::test_real_traces_name_the_basic_lever",
    "tests/test_bench_comm_overlap.py::test_end_to_end_on_two_cpu_ranks",
    "tests/test_bench_runner.py::test_precompile_pass_reports_crashes_as_known",
    "tests/test_bench_runner.py::test_run_shape_with_present_schedules_gives_complete_verified_rows",
    "tests/test_bench_split_kv.py::test_tiny_smoke_writes_rows_and_table",
    "tests/test_counters.py::test_a_failing_target_becomes_a_note",
    "tests/test_eval_set.py::test_precision_and_recall_over_the_set",
    "tests/test_generate.py::test_generated_grouped_variant_fp16_checks_under_interpreter",
    "tests/test_generate.py::test_generated_persistent_fp32_copy_beside_variant_on_misaligned_shape",
    "tests/test_generate.py::test_generated_split_k_variant_bf16_under_interpreter",
    "tests/test_generate_split_kv.py::test_generated_check_runs_under_the_interpreter",
    "tests/test_grouped_gemm.py::test_compiles_for_sm90_with_vector_loads_when_aligned",
    "tests/test_grouped_gemm.py::test_staged_group_of_odd_sizes",
    "tests/test_hf_workloads.py::test_a_scenario_whose_package_is_missing_fails_alone",
    "tests/test_hf_workloads.py::test_help_and_list_without_the_model_packages",
    "tests/test_hostile_inputs.py::test_database_locked_by_a_writer_fails_fast_and_says_so",
    "tests/test_hostile_inputs.py::test_huge_names_are_cut_in_report_json",
    "tests/test_inputs_untouched.py::test_inputs_untouched_and_outputs_elsewhere",
    "tests/test_loop.py::test_gpu_path_on_the_interpreter",
    "tests/test_multirank.py::test_corpus_a100_nccl",
    "tests/test_skill_and_readme.py::test_every_skill_command_runs",
    "tests/test_stream_k_gemm.py::test_aligned_fixup_in_reversed_launch_order",
    "tests/test_stream_k_gemm.py::test_column_pieces_claims_and_clean_scratch",
    "tests/test_stream_k_gemm.py::test_column_pieces_dtypes_and_layouts",
    "tests/test_stream_k_gemm.py::test_column_pieces_split",
    "tests/test_stream_k_gemm.py::test_edge_first",
    "tests/test_stream_k_gemm.py::test_edge_first_claims_and_clean_scratch",
    "tests/test_stream_k_gemm.py::test_helper_claims",
    "tests/test_stream_k_gemm.py::test_split_dtypes_and_layouts",
    "tests/test_stream_k_gemm.py::test_staged_misaligned_rows",
    "tests/test_string_storage.py::test_same_findings_with_and_without_pyarrow",
    "tests/test_ws_gemm.py::test_flagship_compiles_for_sm90_and_ws_engages",
    "tests/test_ws_gemm.py::test_pipelined_configs_match_reference",
})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("[")[0] in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
