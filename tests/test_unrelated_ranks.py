"""Several trace files are read as the ranks of one run only when they can be (issue 32,
class 9): two unrelated corpus traces were read as ranks 3 and 0 of one run, and one file
given twice as two ranks, with cross-rank figures (slowest_rank) printed."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from conftest import DATA

from advisor.cli import cli
from advisor.diagnose.diagnosis import diagnose
from advisor.errors import TraceError
from advisor.traces import load_trace


def kineto(corpus, name):
    return corpus / "kineto" / name


def one_line_error(result):
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert "\n" not in err and err.startswith("advisor: error:"), err
    return err


def test_different_gpus_colliding_ranks_and_clocks_are_refused(corpus):
    # an A100 (2024-05, distributedInfo rank 0) and an H800 (2025-02, rank 0): not one run
    a, b = kineto(corpus, "hta_a100_nccl.json.gz"), kineto(corpus, "deepseek_h800_moe_dualpipe_train.json.gz")
    err = one_line_error(CliRunner().invoke(cli, ["diagnose", str(a), str(b), "--json"]))
    assert "both declare rank 0" in err
    assert "A100" in err and "H800" in err
    assert "never meet" in err and "--allow-unrelated" in err


def test_clocks_that_never_meet_are_refused(corpus):
    # both V100 runs, ranks 1 and 0, but profiled 282 days apart
    a = kineto(corpus, "hta_v100_2rank_allreduce.json.gz")
    b = kineto(corpus, "param_dlrm_v100_8rank/worker0.json.gz")
    with pytest.raises(TraceError, match=r"never meet \(282 days apart\)") as exc:
        load_trace([a, b])
    assert "declare" not in str(exc.value) and " on " not in str(exc.value)


def test_same_content_twice_is_refused(corpus, tmp_path):
    a = kineto(corpus, "param_dlrm_v100_8rank/worker0.json.gz")
    copy = shutil.copy(a, tmp_path / "rank1.json.gz")
    err = one_line_error(CliRunner().invoke(cli, ["summary", str(a), str(copy)]))
    assert "same content" in err


def test_one_run_still_reads(corpus):
    paths = sorted((corpus / "kineto" / "param_dlrm_v100_8rank").glob("worker*.json.gz"))
    t = load_trace(paths)
    assert t.ranks == list(range(8)) and "unrelated_ranks" not in t.meta


def test_our_two_rank_traces_still_read():
    d = DATA / "h200x2"
    t = load_trace([d / "mlp_plain_rank0.sqlite.gz", d / "mlp_plain_rank1.sqlite.gz"])
    assert t.ranks == [0, 1] and "unrelated_ranks" not in t.meta


def test_allow_unrelated_notes_and_drops_cross_rank_figures(corpus):
    a, b = kineto(corpus, "hta_a100_nccl.json.gz"), kineto(corpus, "deepseek_h800_moe_dualpipe_train.json.gz")
    r = CliRunner().invoke(cli, ["diagnose", str(a), str(b), "--json", "--allow-unrelated"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert any("not as one run" in n for n in out["notes"])
    comm = [f for f in out["findings"] if f["symptom"] == "exposed_comm"]
    assert comm  # the A100's all-reduces are still judged, on its own clock
    for f in comm:
        assert "slowest_rank" not in f["evidence"] and "critical_path" not in f["evidence"]
        assert f["evidence"]["alignment"]["status"] == "unrelated"


def test_slowest_rank_only_when_aligned(corpus):
    # one rank of a 2-rank run and one of an 8-rank run, same GPU model, clocks forced apart
    # by the flag: before, "slowest_rank" was printed although no collective was matched
    a = kineto(corpus, "hta_v100_2rank_allreduce.json.gz")
    b = kineto(corpus, "param_dlrm_v100_8rank/worker0.json.gz")
    d = diagnose(load_trace([a, b], allow_unrelated=True))
    for f in d.findings:
        assert "slowest_rank" not in f.evidence
