"""Every example ends the same way: a RESULT line of the one schema (distgnn.train.result) with the shared keys
first, ``epoch_time_s`` the median after the first epoch, and bad input as one ``error:`` line and exit code 2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from distgnn.train.result import SCHEMAS, SHARED_KEYS, ResultSchema, epoch_time_s, print_result, read_result

ROOT = Path(__file__).resolve().parents[2]
KIND = {"graphsage": "node", "rgcn": "node", "link_prediction": "link", "tgn": "temporal", "snapshot": "snapshot"}
STATIC = ["--quiet", "--no-malloc-tuning", "--max-batches=2", "--num-threads=1"]
MAG = ["--dataset=synthetic-mag", "--num-papers=800", "--feat-dim=8", "--synthetic-classes=4", "--fanouts=4,4"]
MAG += ["--batch-size=128", "--hidden=16", *STATIC]
# The example tests' small flags, two epochs each.
SMALL = {
    "graphsage": ["--dataset=synthetic", "--num-nodes=1000", "--feat-dim=8", "--fanouts=4,4", "--hidden=16", *STATIC],
    "rgcn": MAG,
    "link_prediction": [*MAG, "--target-etype=author:writes:paper"],
    "tgn": ["--dataset=synthetic-events:200:4000", "--memory-dim=8", "--time-dim=4", "--embedding-dim=8"],
    "snapshot": ["--dataset=synthetic", "--synthetic-nodes=500", "--synthetic-snapshots=10", "--hidden=8"],
}
SMALL["tgn"] += ["--neighbors=4", "--quiet", "--num-threads=1"]
SMALL["snapshot"] += ["--quiet", "--num-threads=1"]
# Input that cannot be read: the one error line names it.
MISSING = {
    "graphsage": ["--dataset=cora", "--data-dir=/nonexistent/planetoid"],  # Cora files absent (offline)
    "rgcn": ["--dataset=chunked:/nonexistent/metadata.json"],
    "link_prediction": ["--dataset=npz:/nonexistent/graph.npz"],
    "tgn": ["--dataset=events:/nonexistent/events.csv"],
    "snapshot": ["--dataset=events:/nonexistent/events.csv"],
}


def load(name: str):
    path = ROOT / "examples" / name / "train_dist.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}_result", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def printed_result(out: str) -> dict:
    try:
        return read_result(out)
    except ValueError as err:
        raise AssertionError(out[-3000:]) from err


@pytest.mark.parametrize("name", sorted(KIND))
def test_every_example_prints_the_shared_keys_first_and_its_kinds_keys(name: str, capsys) -> None:
    assert load(name).main([*SMALL[name], "--single", "--epochs=2", "--no-eval"]) == 0
    result = printed_result(capsys.readouterr().out)
    assert tuple(result)[: len(SHARED_KEYS)] == SHARED_KEYS
    assert set(SCHEMAS[KIND[name]].keys) <= result.keys()
    assert (result["backend"], result["num_trainers"], result["num_parts"], result["epochs"]) == (None, 1, 1, 2)
    # Two epochs: the epoch time is the second one's.
    assert len(result["epoch_times_s"]) == 2
    assert result["epoch_time_s"] == pytest.approx(result["epoch_times_s"][1], abs=1e-4)
    evaluation = frozenset().union(*SCHEMAS[KIND[name]].evaluation) | {"val_acc", "test_mrr", "test_auc"}
    assert not evaluation & result.keys()


@pytest.mark.parametrize("name", sorted(KIND))
def test_unreadable_input_is_one_error_line_and_exit_code_2(name: str, capsys) -> None:
    assert load(name).main([*SMALL[name], *MISSING[name], "--single"]) == 2
    captured = capsys.readouterr()
    assert "RESULT" not in captured.out
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert "/nonexistent/" in captured.err


def test_the_local_runner_reports_bad_input_the_same_way(tmp_path, capsys) -> None:
    argv = [*SMALL["graphsage"], *MISSING["graphsage"], "--local", f"--workdir={tmp_path}"]
    assert load("graphsage").main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Planetoid file /nonexistent/planetoid/") and err.count("\n") == 1, err


def test_epoch_time_is_the_median_after_the_first_epoch() -> None:
    assert epoch_time_s([9.0, 1.0, 3.0, 2.0]) == 2.0
    assert epoch_time_s([9.0, 1.0, 2.0]) == 1.5
    assert epoch_time_s([4.0]) == 4.0
    assert epoch_time_s([]) is None


def test_the_schema_names_what_a_result_lacks() -> None:
    schema = ResultSchema("demo", ("loss",), (frozenset({"test_mse"}), frozenset({"test_mrr", "test_auc"})))
    shared = dict.fromkeys(SHARED_KEYS, 0)
    schema.check({**shared, "loss": 1.0})
    schema.check({**shared, "loss": 1.0, "test_mrr": 0.5, "test_auc": 0.9})
    with pytest.raises(ValueError, match=r"demo RESULT lacks \['epoch_times_s', 'loss'\]"):
        schema.check({k: v for k, v in shared.items() if k != "epoch_times_s"})
    with pytest.raises(ValueError, match=r"evaluation keys \['test_mrr'\]; expected one of"):
        schema.check({**shared, "loss": 1.0, "test_mrr": 0.5})


def test_read_result_reads_back_the_printed_line_and_names_a_missing_or_second_one(capsys) -> None:
    result = {**dict.fromkeys(SHARED_KEYS, 1), "loss": 0.5}
    schema = ResultSchema("demo", ("loss",), (frozenset({"test_mse"}),))
    SCHEMAS["demo"] = schema
    try:
        print("epoch 0 loss 0.9")
        print_result(result, "demo")
    finally:
        del SCHEMAS["demo"]
    out = capsys.readouterr().out
    assert read_result(out) == result
    with pytest.raises(ValueError, match="expected one RESULT line in the run's output, found 0"):
        read_result("epoch 0 loss 0.9\n")
    with pytest.raises(ValueError, match="found 2"):
        read_result(out + out)
