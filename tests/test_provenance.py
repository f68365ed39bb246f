"""Inputs that belong together and runs that ask only what their method has (issue 23).

Every artefact records the annotations it was made from (caprl.io.provenance) and every stage
checks it before work; what a run's definition may ask of its method is decided in
caprl.objectives.run_checks, which the plan (``snakemake -n``, test_bad_input_research) and the stages
call alike. Each test runs the real stage as the workflow does and reads its one-line error.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline_data import DatasetPaths
from stage_inputs import LOOKAHEAD_ON_XE, caprl, degenerate_checkpoint, user_error, write_params


@pytest.fixture(scope="module")
def dataset(research_dataset: DatasetPaths) -> DatasetPaths:
    return research_dataset


OTHER_DATASET = ({"dataset": "bigger"}, "was made for dataset 'bigger', but {annotations} is dataset 'synthetic'")
OTHER_IMAGES = ({"annotations_sha": "0123456789abcdef"}, "was made from annotations with fingerprint "
                                                         "0123456789abcdef, but {annotations} has ")



def train_fc_scst(dataset: DatasetPaths, *args: Any) -> subprocess.CompletedProcess[str]:
    out = dataset.workdir / "out-scst"
    return caprl("train", dataset.params, "--dataset", "synthetic", "--run", "fc-scst", *args,
                 "--checkpoint", out / "best.pt", "--history", out / "history.json", "--state-dir", out / "state",
                 cwd=dataset.workdir)


def test_train_refuses_a_caption_model_from_a_run_that_trains_none(dataset: DatasetPaths) -> None:
    """``--init model=`` a listener's checkpoint: its caption model is untrained; refused before
    any work, in the plan's words."""
    listener = degenerate_checkpoint(dataset, "listener", "listener", "a", dataset.workdir / "checks" / "listener.pt")
    err = user_error(train_fc_scst(dataset, *dataset.train_args(), "--init", f"model={listener}"), "train")
    assert err.endswith(f"--init model={listener}: runs.fc-scst.init.model: run listener (method listener) trains "
                        "no caption model, so its checkpoint's caption model is untrained; name a run that trains "
                        "one (e.g. an xe run)")
    assert not (dataset.workdir / "out-scst").exists()


def evaluate_fc_xe(dataset: DatasetPaths, out: Path, params: Path | None = None,
                   refs: Path | None = None) -> subprocess.CompletedProcess[str]:
    xe = fc_xe_checkpoint(dataset)
    return caprl("evaluate", params or dataset.params, "--dataset", "synthetic", "--run", "fc-xe", "--checkpoint", xe,
                 "--annotations", dataset.annotations, "--vocab", dataset.vocab, "--labels", dataset.labels,
                 "--features", dataset.features, "--refs", refs or dataset.references["test"],
                 "--out-captions", out / "captions.json", "--out-scores", out / "scores.json",
                 "--out-examples", out / "examples.json", cwd=dataset.workdir)


def test_evaluate_refuses_lookahead_for_a_run_without_a_value_network_in_the_plans_words(
        dataset: DatasetPaths) -> None:
    params = yaml.safe_load(dataset.params.read_text())
    params["runs"]["fc-xe"]["decode"] = {"method": "lookahead"}
    out = dataset.workdir / "lookahead"
    proc = evaluate_fc_xe(dataset, out, params=write_params(out, params))
    assert user_error(proc, "evaluate").endswith(LOOKAHEAD_ON_XE)
    assert not (out / "scores.json").exists()


@pytest.mark.parametrize("made_from, says", [OTHER_DATASET, OTHER_IMAGES])
def test_evaluate_refuses_references_of_other_annotations(dataset: DatasetPaths, made_from: dict[str, str],
                                                          says: str) -> None:
    refs = json.loads(dataset.references["test"].read_text())
    assert refs["info"]["made_from"]["dataset"] == "synthetic"
    refs["info"]["made_from"].update(made_from)
    out = dataset.workdir / f"refs-{next(iter(made_from))}"
    out.mkdir()
    (out / "refs.json").write_text(json.dumps(refs))
    err = user_error(evaluate_fc_xe(dataset, out, refs=out / "refs.json"), "evaluate")
    assert f"error: {out / 'refs.json'} " + says.format(annotations=dataset.annotations) in err
    assert "`caprl references`" in err and not (out / "scores.json").exists()


def foreign_copy(dataset: DatasetPaths, which: str, made_from: dict[str, str]) -> Path:
    """A copy of the dataset's ``which`` file (features, labels, cider_df) whose record of the
    annotations says ``made_from`` (as another dataset's file would)."""
    import h5py

    source = getattr(dataset, which)
    path = dataset.workdir / f"other_{source.name}"
    shutil.copy(source, path)
    if path.suffix == ".h5":
        with h5py.File(path, "a") as h5:
            h5.attrs.update(made_from)
    else:
        doc = json.loads(path.read_text())
        doc["made_from"] = {**doc["made_from"], **made_from}
        path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("which, remake", [("features", "caprl features + caprl merge-features"),
                                           ("labels", "`caprl vocab`"), ("cider_df", "`caprl cider-df`")])
@pytest.mark.parametrize("made_from, says", [OTHER_DATASET, OTHER_IMAGES])
def test_train_refuses_inputs_made_from_other_annotations(dataset: DatasetPaths, which: str, remake: str,
                                                          made_from: dict[str, str], says: str) -> None:
    """Features, labels and document frequencies record the annotations they were made from
    (dataset, fingerprint of the images' ids and splits: caprl.io.provenance); training checks them
    and refuses a file of other images, both files named, with the command that makes the right one."""
    made = {"features": lambda p: dict(h5py_attrs(p)), "labels": lambda p: dict(h5py_attrs(p)),
            "cider_df": lambda p: json.loads(p.read_text())["made_from"]}[which](getattr(dataset, which))
    assert made["dataset"] == "synthetic" and len(made["annotations_sha"]) == 16
    other = foreign_copy(dataset, which, made_from)
    args = [a if a != str(getattr(dataset, which)) else str(other) for a in dataset.train_args()]
    err = user_error(train_fc_scst(dataset, *args, "--init", f"model={fc_xe_checkpoint(dataset)}"), "train")
    assert f"error: {other} " + says.format(annotations=dataset.annotations) in err
    assert f"make it again from {dataset.annotations} (" in err and remake in err
    assert not (dataset.workdir / "out-scst" / "best.pt").exists()


def h5py_attrs(path: Path) -> dict[str, Any]:
    import h5py

    with h5py.File(path) as h5:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in h5.attrs.items()}


def fc_xe_checkpoint(dataset: DatasetPaths) -> Path:
    """A real fc-xe checkpoint on the dataset (what fc-scst starts from)."""
    path = dataset.workdir / "checks" / "fc-xe.pt"
    return path if path.exists() else degenerate_checkpoint(dataset, "fc-xe", "xe", "a", path)


def test_labels_of_another_vocabulary_are_refused(dataset: DatasetPaths, tmp_path: Path) -> None:
    vocab = json.loads(dataset.vocab.read_text())
    vocab["idx_to_word"] = vocab["idx_to_word"][:-1] + ["zebra", "UNK"]  # one word more
    from caprl.data.vocab import vocab_hash

    vocab["sha256"] = vocab_hash(vocab["idx_to_word"])
    other = tmp_path / "vocab.json"
    other.write_text(json.dumps(vocab))
    args = [a if a != str(dataset.vocab) else str(other) for a in dataset.train_args()]
    err = user_error(train_fc_scst(dataset, *args), "train")
    assert f"error: {dataset.labels} was encoded with another vocabulary" in err and str(other) in err


def test_a_file_made_before_provenance_is_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Old files (no record) are not refused: the stage says it cannot check them, and how to fix."""
    from caprl.io import provenance

    annotations = {"dataset": "synthetic", "images": [{"id": 2, "split": "val"}, {"id": 1, "split": "train"}]}
    with caplog.at_level("WARNING"):
        provenance.check("labels.h5", {}, "annotations.json", annotations, "`caprl vocab`")
    assert "labels.h5 records no annotations fingerprint (made by an older caprl)" in caplog.text
    assert "make it again from annotations.json (`caprl vocab`)" in caplog.text
    same = provenance.record({"dataset": "synthetic", "images": [{"id": 1, "split": "train", "raw": ["x"]},
                                                                  {"id": 2, "split": "val"}]})
    assert same == provenance.record(annotations)  # the captions and the order do not enter
    moved = {"dataset": "synthetic", "images": [{"id": 1, "split": "train"}, {"id": 2, "split": "test"}]}
    assert provenance.fingerprint(moved) != provenance.fingerprint(annotations)


def test_a_checkpoint_records_its_data_and_is_refused_with_other_features(dataset: DatasetPaths) -> None:
    """Training records the annotations and the features' backbone and settings in every
    checkpoint; evaluation refuses the checkpoint with features of another backbone or setting
    (a shared checkpoint's "gibberish captions"), naming both files."""
    import dataclasses

    from caprl.models import checkpoint
    from caprl.io import provenance

    out = dataset.workdir / "out-xe"
    proc = caprl("train", dataset.params, "--dataset", "synthetic", "--run", "fc-xe", *dataset.train_args(),
                 "--checkpoint", out / "best.pt", "--history", out / "history.json", "--state-dir", out / "state",
                 cwd=dataset.workdir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    made = checkpoint.load(out / "best.pt").made_from
    assert made == {**provenance.record(json.loads(dataset.annotations.read_text())),
                    "features": provenance.features_record(features_attrs(dataset.features))}
    assert "code_version" not in made["features"]["settings"]
    other = dataclasses.replace(checkpoint.load(out / "best.pt"),
                                made_from={**made, "features": {**made["features"], "backbone": "resnet101",
                                                                "dim": 2048}})
    checkpoint.save(out / "other.pt", other)
    result = dataset.workdir / "other-features"
    proc = caprl("evaluate", dataset.params, "--dataset", "synthetic", "--run", "fc-xe", "--checkpoint",
                 out / "other.pt", "--annotations", dataset.annotations, "--vocab", dataset.vocab, "--labels",
                 dataset.labels, "--features", dataset.features, "--refs", dataset.references["test"],
                 "--out-captions", result / "captions.json", "--out-scores", result / "scores.json",
                 "--out-examples", result / "examples.json", cwd=dataset.workdir)
    err = user_error(proc, "evaluate")
    assert f"error: {out / 'other.pt'} was trained on other features than {dataset.features} (backbone " \
           "'resnet101' there, 'tinycnn' here; dim 2048 there" in err
    assert not result.exists() or not (result / "scores.json").exists()



def features_attrs(path: Path) -> dict[str, Any]:
    import h5py

    with h5py.File(path) as h5:
        return dict(h5.attrs)
