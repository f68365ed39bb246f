"""Bottom-up-attention TSV -> features HDF5: files written the way bottom-up-attention's
generate_tsv.py writes them (csv.DictWriter, tab, base64 of float32), read back through the
project's own feature reader."""

from __future__ import annotations

import base64
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from caprl.data.bottomup import FIELDNAMES, convert, iter_rows
from caprl.errors import CaprlError
from caprl.data.feature_store import Features, check_file
from numerics import mean_atol

BOXES, DIM = 36, 2048


def make_row(image_id: int, rng: np.random.Generator, num_boxes: int = BOXES, dim: int = DIM) -> dict:
    w, h = int(rng.integers(300, 640)), int(rng.integers(300, 640))
    xy = rng.uniform(0, 200, size=(num_boxes, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(10, 100, size=(num_boxes, 2))], axis=1).astype(np.float32)
    features = rng.gamma(0.5, 1.0, size=(num_boxes, dim)).astype(np.float32)  # post-ReLU pool5: >= 0
    return {"image_id": image_id, "image_w": w, "image_h": h, "num_boxes": num_boxes,
            "boxes": base64.b64encode(boxes.tobytes()).decode("ascii"),
            "features": base64.b64encode(features.tobytes()).decode("ascii"),
            "_arrays": (boxes, features)}


def write_tsv(path: Path, rows: list[dict]) -> Path:
    """Written as generate_tsv.py does: csv.DictWriter, tab-delimited, no header ("\\r\\n" line ends)."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, delimiter="\t", fieldnames=FIELDNAMES, extrasaction="ignore")
        for row in rows:
            writer.writerow(row)
    return path


@pytest.fixture
def rows() -> list[dict]:
    rng = np.random.default_rng(0)
    return [make_row(i, rng) for i in (391895, 9, 522418, 184613)]  # COCO ids, not sorted


def test_iter_rows_decodes_each_field(tmp_path: Path, rows: list[dict]) -> None:
    tsv = write_tsv(tmp_path / "trainval_36.tsv", rows)
    assert len(rows[0]["features"]) > 131072  # a field longer than csv's default field_size_limit
    got = list(iter_rows(tsv))
    assert [r.image_id for r in got] == [r["image_id"] for r in rows]
    for r, want in zip(got, rows):
        assert (r.image_w, r.image_h) == (want["image_w"], want["image_h"])
        assert r.boxes.shape == (BOXES, 4) and r.features.shape == (BOXES, DIM)
        np.testing.assert_array_equal(r.boxes, want["_arrays"][0])
        np.testing.assert_array_equal(r.features, want["_arrays"][1])


@pytest.mark.numerics
def test_convert_reads_back_through_the_feature_reader(tmp_path: Path, rows: list[dict]) -> None:
    a = write_tsv(tmp_path / "karpathy_train.tsv.0", rows[:3])
    b = write_tsv(tmp_path / "karpathy_train.tsv.1", rows[3:])
    out = tmp_path / "features" / "bottomup.h5"
    assert convert([a, b], out, dataset="coco") == 4
    by_id = {r["image_id"]: r for r in rows}
    with h5py.File(out, "r") as h5:
        attrs = check_file(h5, out)
        assert list(h5["image_ids"][:]) == sorted(by_id)  # rows sorted by id, like merge-features
        for k, image_id in enumerate(h5["image_ids"][:]):
            np.testing.assert_array_equal(h5["boxes"][k], by_id[int(image_id)]["_arrays"][0])
            assert list(h5["image_size"][k]) == [by_id[int(image_id)]["image_w"], by_id[int(image_id)]["image_h"]]
    assert attrs["backbone"] == "bottomup" and attrs["grid"] == 0 and attrs["dataset"] == "coco"
    assert (attrs["dim"], attrs["n_regions"]) == (DIM, BOXES)
    assert json.loads(attrs["backbone_config"])["files"] == [a.name, b.name]
    ids = [522418, 9, 184613]
    for in_memory in (True, False):
        with Features(out, in_memory=in_memory) as feats:
            assert (feats.dim, feats.n_regions, len(feats)) == (DIM, BOXES, 4)
            pooled, regions = feats.get(ids)
        assert pooled.shape == (3, DIM) and regions.shape == (3, BOXES, DIM)
        for k, image_id in enumerate(ids):
            features = by_id[image_id]["_arrays"][1]
            np.testing.assert_array_equal(regions[k].numpy(), features)  # att = the 36 boxes
            np.testing.assert_allclose(pooled[k].numpy(), features.mean(axis=0), rtol=0,  # fc = their mean,
                                       atol=mean_atol(BOXES, float(np.abs(features).max())))  # another order
    assert [p.name for p in out.parent.iterdir()] == ["bottomup.h5"]  # no temporary file left


def test_cli_keeps_the_annotations_images(tmp_path: Path, rows: list[dict]) -> None:
    tsv = write_tsv(tmp_path / "trainval_36.tsv", rows)
    images = [{"id": i, "file": f"val2014/COCO_val2014_{i:012d}.jpg", "split": "val", "captions": [["a", "dog"]],
               "raw": ["A dog."]} for i in (9, 391895)]
    annotations = tmp_path / "annotations.json"
    annotations.write_text(json.dumps({"dataset": "coco", "images": images}))
    out = tmp_path / "bottomup.h5"
    run = subprocess.run([sys.executable, "-m", "caprl", "bottomup", "--tsv", str(tsv), "--out", str(out),
                          "--annotations", str(annotations), "--dataset", "coco"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    with Features(out) as feats:
        assert list(feats.image_ids) == [9, 391895]
    images.append({**images[0], "id": 77})
    annotations.write_text(json.dumps({"dataset": "coco", "images": images}))
    run = subprocess.run([sys.executable, "-m", "caprl", "bottomup", "--tsv", str(tsv), "--out", str(out),
                          "--annotations", str(annotations)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no bottom-up features for image id(s) 77" in run.stderr, run.stderr


def _corrupt(row: dict, how: str) -> str:
    fields = [str(row[name]) for name in FIELDNAMES]
    if how == "fields":
        fields = fields[:5]
    elif how == "short":
        fields[5] = base64.b64encode(base64.b64decode(fields[5])[:-8]).decode()
    elif how == "base64":
        fields[4] = fields[4][:-3] + "!!="
    elif how == "int":
        fields[3] = "thirty-six"
    return "\t".join(fields) + "\r\n"


@pytest.mark.parametrize("how, message", [
    ("fields", "5 tab-separated fields, expected 6"),
    ("short", "features decodes to 294904 bytes, expected num_boxes x 2048 float32 = 36 x 2048 x 4 = 294912"),
    ("base64", "boxes is not valid base64"),
    ("int", "num_boxes is 'thirty-six', not an integer"),
])
def test_bad_line_names_file_and_line(tmp_path: Path, rows: list[dict], how: str, message: str) -> None:
    tsv = write_tsv(tmp_path / "trainval_36.tsv", rows[:2])
    with open(tsv, "a", newline="") as fh:
        fh.write(_corrupt(rows[2], how))
    with pytest.raises(CaprlError, match=re.escape(f"{tsv}:3: ")) as exc:
        list(iter_rows(tsv))
    assert message in str(exc.value)
    out = tmp_path / "bottomup.h5"
    with pytest.raises(CaprlError, match=re.escape(f"{tsv}:3: {message}")):
        convert([tsv], out)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["trainval_36.tsv"]


def test_box_count_and_duplicates_are_named(tmp_path: Path, rows: list[dict]) -> None:
    rng = np.random.default_rng(1)
    varying = write_tsv(tmp_path / "adaptive.tsv", [rows[0], make_row(5, rng, num_boxes=10)])
    with pytest.raises(CaprlError, match=re.escape(f"{varying}:2: 10 boxes, but earlier rows have 36")):
        convert([varying], tmp_path / "x.h5")
    a = write_tsv(tmp_path / "a.tsv", rows[:2])
    b = write_tsv(tmp_path / "b.tsv", rows[1:3])
    with pytest.raises(CaprlError, match=re.escape(f"{b}:1: image_id 9 again (first at {a}:2)")):
        convert([a, b], tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()
