"""Karpathy JSON -> normalised annotations: format, splits, tokenisation, errors, atomic output."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from caprl.data import karpathy, prepare, synthetic
from caprl.data.annotations import load_annotations
from caprl.errors import CaprlError

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "params.schema.yaml"


def coco_like() -> dict:
    """A small Karpathy COCO-style file: cocoid + filepath, a restval image, empty captions."""
    def image(imgid, cocoid, split, sentences):
        return {"filepath": "val2014" if split != "train" else "train2014",
                "filename": f"COCO_{cocoid:012d}.jpg", "imgid": imgid, "cocoid": cocoid, "split": split,
                "sentids": list(range(len(sentences))),
                "sentences": [{"tokens": karpathy.tokenize(r), "raw": r, "imgid": imgid, "sentid": k}
                              for k, r in enumerate(sentences)]}

    return {"dataset": "coco", "images": [
        image(0, 391895, "test", ["A man riding a bike.", "A Man's bike, on a road!"]),
        image(1, 522418, "restval", ["A woman cutting a cake.", " ... "]),
        image(2, 184613, "train", ["A dog.", "Two dogs play."]),
        image(3, 318219, "val", ["!!", ""]),
    ]}


def annotate(data: dict, name: str = "coco") -> dict:
    return karpathy.prepare_annotations(data, name, source="dataset_coco.json")


def test_tokenize_is_karpathy_style() -> None:
    assert karpathy.tokenize("A Man's dog, running -- fast!") == ["a", "mans", "dog", "running", "fast"]
    assert karpathy.tokenize("  ?! ") == []


def test_coco_like_ids_files_splits_and_drops() -> None:
    out = annotate(coco_like())
    assert out["dataset"] == "coco"
    assert [im["id"] for im in out["images"]] == [184613, 391895, 522418]  # sorted; image 3 dropped
    by_id = {im["id"]: im for im in out["images"]}
    assert by_id[522418]["split"] == "train"  # restval counts as train
    assert by_id[391895]["split"] == "test"
    assert by_id[391895]["file"] == "val2014/COCO_000000391895.jpg"
    assert by_id[391895]["captions"] == [["a", "man", "riding", "a", "bike"], ["a", "mans", "bike", "on", "a", "road"]]
    assert by_id[391895]["raw"] == ["A man riding a bike.", "A Man's bike, on a road!"]
    assert by_id[522418]["captions"] == [["a", "woman", "cutting", "a", "cake"]]
    assert by_id[522418]["raw"] == ["A woman cutting a cake."]
    stats = out["stats"]
    assert stats["restval_as_train"] == 1
    assert stats["empty_captions_dropped"] == 3
    assert stats["images_without_captions_dropped"] == 1
    assert stats["images_read"] == 4 and stats["images"] == 3 and stats["captions"] == 5
    assert stats["split_images"] == {"train": 2, "val": 0, "test": 1}


def test_flickr_like_uses_imgid_and_tokenises_raw_when_no_tokens() -> None:
    data = {"dataset": "flickr30k", "images": [
        {"filename": "1000092795.jpg", "imgid": 5, "split": "train",
         "sentences": [{"raw": "Two young, White males are outside."}]},
        {"filename": "10002456.jpg", "imgid": 2, "split": "val", "sentences": [{"tokens": ["Several", "men"]}]},
    ]}
    out = karpathy.prepare_annotations(data, "flickr30k")
    assert [(im["id"], im["file"]) for im in out["images"]] == [(2, "10002456.jpg"), (5, "1000092795.jpg")]
    assert out["images"][1]["captions"] == [["two", "young", "white", "males", "are", "outside"]]
    assert out["images"][0]["captions"] == [["several", "men"]]
    assert out["images"][0]["raw"] == ["several men"]


def test_round_trip_of_the_synthetic_dataset(tmp_path: Path) -> None:
    cfg = {"n_train": 6, "n_val": 2, "n_test": 2, "image_size": 32, "max_objects": 3}
    synthetic.write_dataset(synthetic.generate(cfg, 0), 10, tmp_path / "d.json", tmp_path / "images")
    raw = json.loads((tmp_path / "d.json").read_text())
    out = karpathy.prepare_annotations(karpathy.read_karpathy(tmp_path / "d.json", "synthetic"), "synthetic")
    karpathy.check_images(out, tmp_path / "images", "synthetic")
    assert len(out["images"]) == 10
    for src, im in zip(raw["images"], out["images"]):
        assert im["id"] == src["cocoid"]
        assert im["split"] == src["split"]
        assert (tmp_path / "images" / im["file"]).is_file()
        assert im["captions"] == [s["tokens"] for s in src["sentences"]]
        assert im["raw"] == [s["raw"] for s in src["sentences"]]
    loaded_back = json.loads(json.dumps(out))
    assert loaded_back["images"] == out["images"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [("coco", ["dataset_coco.json", "caption_datasets", "train2014", "val2014", "docs/real-data.md"]),
     ("flickr30k", ["dataset_flickr30k.json", "Flickr30k", "docs/real-data.md"]),
     ("synthetic", ["caprl synthesize"])],
)
def test_missing_karpathy_json_says_where_and_how(tmp_path: Path, name: str, expected: list[str]) -> None:
    path = tmp_path / "raw" / f"dataset_{name}.json"
    with pytest.raises(CaprlError) as err:
        karpathy.read_karpathy(path, name)
    message = str(err.value)
    assert str(path) in message and f"datasets.{name}.raw" in message
    for text in expected:
        assert text in message


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "dataset_coco.json"
    path.write_text('{"images": [\n  {"imgid": 1,\n   "split": "train"\n   "filename": "x.jpg"}\n]}\n')
    with pytest.raises(CaprlError, match=r"dataset_coco\.json.*line 4"):
        karpathy.read_karpathy(path, "coco")


def test_missing_key_names_image_index_and_key() -> None:
    data = coco_like()
    del data["images"][2]["split"]
    with pytest.raises(CaprlError, match=r"images\[2\] has no key 'split'"):
        annotate(data)
    data = coco_like()
    del data["images"][1]["sentences"][0]["tokens"], data["images"][1]["sentences"][0]["raw"]
    with pytest.raises(CaprlError, match=r"images\[1\]\.sentences\[0\] has neither 'tokens' nor 'raw'"):
        annotate(data)


def test_bad_split_and_duplicate_ids_are_errors() -> None:
    data = coco_like()
    data["images"][0]["split"] = "dev"
    with pytest.raises(CaprlError, match=r"images\[0\]\.split is 'dev'"):
        annotate(data)
    data = coco_like()
    data["images"][2]["cocoid"] = data["images"][0]["cocoid"]
    with pytest.raises(CaprlError, match=r"images\[2\] repeats id 391895 of images\[0\]"):
        annotate(data)


def test_check_images_reports_missing_files(tmp_path: Path) -> None:
    out = annotate(coco_like())
    with pytest.raises(CaprlError, match="image root not found"):
        karpathy.check_images(out, tmp_path / "nope", "coco")
    (tmp_path / "train2014").mkdir()
    (tmp_path / "train2014" / "COCO_000000184613.jpg").write_bytes(b"")
    with pytest.raises(CaprlError, match=r"2 of 3 images are missing.*val2014/COCO_000000391895\.jpg"):
        karpathy.check_images(out, tmp_path, "coco")


def test_load_annotations_validates(tmp_path: Path) -> None:
    out = annotate(coco_like())
    good = tmp_path / "ann.json"
    good.write_text(json.dumps(out))
    assert load_annotations(good) == out
    bad = json.loads(json.dumps(out))
    del bad["images"][1]["file"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CaprlError, match=r"bad\.json: images\[1\] has no key 'file'"):
        load_annotations(tmp_path / "bad.json")
    bad = json.loads(json.dumps(out))
    bad["images"][0]["captions"].append([])
    bad["images"][0]["raw"].append("")
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CaprlError, match=r"images\[0\]\.captions must be"):
        load_annotations(tmp_path / "bad.json")
    bad = json.loads(json.dumps(out))
    bad["images"][2]["id"] = bad["images"][0]["id"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CaprlError, match=r"images\[2\] repeats id 184613 of images\[0\]"):
        load_annotations(tmp_path / "bad.json")
    with pytest.raises(CaprlError, match="caprl prepare"):
        load_annotations(tmp_path / "missing.json")


def test_nothing_left_is_an_error() -> None:
    data = coco_like()
    data["images"] = data["images"][3:]  # only the image whose captions are all empty
    with pytest.raises(CaprlError, match="no image with a non-empty caption"):
        annotate(data)


def _main_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    monkeypatch.setenv("CAPRL_PARAMS_SCHEMA", str(SCHEMA))
    data = coco_like()  # its val image has only empty captions: give prepare one it keeps (val is needed)
    data["images"].append({**data["images"][3], "imgid": 4, "cocoid": 42, "filename": "COCO_000000000042.jpg",
                           "sentences": [{"raw": "A cat."}]})
    (tmp_path / "dataset_coco.json").write_text(json.dumps(data))
    for im in data["images"]:
        (tmp_path / "img" / im["filepath"]).mkdir(parents=True, exist_ok=True)
        (tmp_path / "img" / im["filepath"] / im["filename"]).write_bytes(b"")
    return argparse.Namespace(params=REPO / "params.yaml", dataset="synthetic", raw=tmp_path / "dataset_coco.json",
                              media_root=tmp_path / "img", out=tmp_path / "out" / "annotations.json")


def test_main_writes_annotations_with_stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _main_args(tmp_path, monkeypatch)
    prepare.main(args)
    out = json.loads(args.out.read_text())
    assert out["dataset"] == "synthetic"  # --dataset
    assert out["stats"]["empty_captions_dropped"] == 3
    assert [p.name for p in args.out.parent.iterdir()] == ["annotations.json"]


@pytest.mark.parametrize("existing", [True, False])
def test_main_failure_mid_write_leaves_old_output_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool
) -> None:
    args = _main_args(tmp_path, monkeypatch)
    args.out.parent.mkdir()
    if existing:
        args.out.write_text("old")
    real_write_text = pathlib.Path.write_text

    def half_then_fail(self, data, *a, **kw):
        real_write_text(self, data[: len(data) // 2], *a, **kw)
        raise OSError("No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_text", half_then_fail)
    with pytest.raises(OSError):
        prepare.main(args)
    monkeypatch.undo()
    names = [p.name for p in args.out.parent.iterdir()]
    assert names == (["annotations.json"] if existing else [])
    if existing:
        assert args.out.read_text() == "old"


def test_cli_missing_json_exits_2_with_message(tmp_path: Path) -> None:
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(SCHEMA)}
    cmd = [sys.executable, "-m", "caprl", "prepare", "--params", str(REPO / "params.yaml"), "--dataset", "synthetic",
           "--raw", str(tmp_path / "dataset_synthetic.json"), "--out", str(tmp_path / "a.json")]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Karpathy-split JSON not found" in result.stderr and "caprl synthesize" in result.stderr
    assert not (tmp_path / "a.json").exists()


def test_prepare_reads_through_the_dataset_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   write_params) -> None:
    """--dataset picks the reader (datasets.<name>.format); raw and media default to the dataset's."""
    from caprl.data.readers import READERS, TgifReader, build_reader, media_of

    assert set(READERS) >= {"karpathy", "tgif"}
    assert isinstance(build_reader("tgif", "clips"), TgifReader)  # TGIF reads now (GIFs probed, see test_gif)
    assert (media_of("tgif", "clips"), media_of("karpathy", "coco")) == ("video", "image")
    with pytest.raises(CaprlError, match=r"datasets\.clips\.format: unknown dataset format 'mp4'"):
        build_reader("mp4", "clips")
    args = _main_args(tmp_path, monkeypatch)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"]["coco"].update(raw=str(args.raw), media_root=str(args.media_root))
    args.params, args.dataset, args.raw, args.media_root = write_params(params), "coco", None, None
    prepare.main(args)
    assert json.loads(args.out.read_text())["dataset"] == "coco"
