"""``caprl caption`` and ``snakemake caption_folder``: trained runs' captions of a folder of images.

One real Snakemake run in a fresh copy of the workflow trains two runs (fc-xe, topdown-xe: the
latter with attention) on the tiny synthetic set and captions ``data/caption_images/``: 20
images of the built-in generator, a truncated PNG and a text file named ``.jpg``. The command
is then run as a user runs it (a subprocess), its page opened in headless Chromium.
"""

from __future__ import annotations

import html
import itertools
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from caprl.data import synthetic
from caprl.data.vocab import Vocab
from caprl.decoding import DECODERS, beam_search
from caprl.errors import CaprlError
from caprl.evaluation import caption, caption_folder, caption_page
from caprl.models import checkpoint
from conftest import REPO, TINY, default_params, merge
from pipeline_data import caprl_command, tiny_files
from screenshot import chromium_path, non_trivial, screenshot, visible_text
from stage_inputs import user_error
from test_e2e import fresh_copy, run

RUNS = ["fc-xe", "topdown-xe"]
GOOD = [f"img{k:02d}.png" for k in range(20)]
BROKEN = {"truncated.png": "image file is truncated", "notes.jpg": "cannot identify image file"}
FOLDER = "data/caption_images"
e2e = pytest.mark.e2e  # the tests that read the real Snakemake run (the fixture `work`)


def params() -> dict[str, Any]:
    p = merge(default_params(), TINY)
    p["runs"] = {"fc-xe": {"method": "xe", "model": "fc", "options": {"epochs": 2}},
                 # enough epochs for captions that differ between images (CIDEr-D ~0.2 on val)
                 "topdown-xe": {"method": "xe", "model": "topdown", "options": {"epochs": 15, "lr": 5.0e-3}}}
    return p


def write_images(folder: Path) -> list[str]:
    """20 generated images and the two broken files; the good files' names."""
    folder.mkdir(parents=True)
    cfg = {"n_train": 0, "n_val": 0, "n_test": 20, "image_size": 64, "max_objects": 2}
    names = []
    for k, sample in enumerate(synthetic.generate(cfg, seed=7, dataset="caption_test")):
        names.append(f"img{k:02d}.png")
        sample.image.save(folder / names[-1])
    png = (folder / names[0]).read_bytes()
    (folder / "truncated.png").write_bytes(png[: len(png) // 2])
    (folder / "notes.jpg").write_text("a text file, not a JPEG\n")
    return names


def documented() -> list[list[str]]:
    """The commands of docs/pipeline.md's section "Captioning your own images", in order."""
    text = (REPO / "docs" / "pipeline.md").read_text().split("## Captioning your own images", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workflow's copy after the documented `snakemake` command (its two runs trained on the way)."""
    work = fresh_copy(tmp_path_factory.mktemp("caption") / "work", params())
    assert write_images(work / FOLDER) == GOOD
    (smk,) = [cmd for cmd in documented() if cmd[0] == "snakemake"]
    assert smk == ["snakemake", "--cores", "2", "caption_folder"]
    run(smk, work)
    return work


def caption_cli(work: Path, *args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(caprl_command("caption", work / "params.yaml", *args), cwd=work, capture_output=True,
                          text=True, timeout=300)


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def check_captions(result: dict[str, Any], names: list[str]) -> None:
    assert [c["file"] for c in result["captions"]] == names
    assert all(c["caption"] and c["logprob"] < 0 for c in result["captions"])
    assert {s["file"]: s["reason"] for s in result["skipped"]}.keys() == BROKEN.keys()
    for s in result["skipped"]:
        assert BROKEN[s["file"]] in s["reason"]


def decode_section(work: Path) -> dict[str, Any]:
    """The workflow copy's ``decode:`` (its runs set none of their own)."""
    return yaml.safe_load((work / "params.yaml").read_text())["decode"]


@e2e
def test_caption_folder_captions_with_every_run_side_by_side(work: Path) -> None:
    results = {r: read(work / "results" / "synthetic" / "captions" / f"{r}.json") for r in RUNS}
    for r, result in results.items():
        check_captions(result, GOOD)
        made_by = result["made_by"]
        assert (made_by["run"], made_by["dataset"], made_by["method"]) == (r, "synthetic", "xe")
        assert made_by["backbone"]["name"] == "tinycnn" and made_by["decode"] == decode_section(work)
        assert (made_by["decode"]["method"], made_by["decode"]["beam_size"]) == ("beam", 2)
        assert made_by["checkpoint"] == f"runs/synthetic/{r}/best.pt" and made_by["code_version"]
    assert len({c["caption"] for c in results["topdown-xe"]["captions"]}) > 3  # it looks at the images
    page = (work / "results" / "synthetic" / "captions" / "index.html").read_text()
    assert page.count('<img class="thumb" src="data:image/png;base64,') == 20
    for r in RUNS:
        assert f"<th>{r}</th>" in page
        assert all(c["caption"] in page for c in results[r]["captions"])
    assert "notes.jpg" in page and "truncated.png" in page
    dry = run(["snakemake", "-n", "--cores", "2", "caption_folder"], work)
    assert "Nothing to be done" in dry.stdout + dry.stderr


@pytest.fixture(scope="module")
def by_hand(work: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The documented ``caprl caption`` command as a user runs it (its outputs in a folder of the
    test's): the process and that folder."""
    (cmd,) = [cmd for cmd in documented() if cmd[:2] == ["caprl", "caption"]]
    out = tmp_path_factory.mktemp("by_hand")
    options = dict(zip(cmd[2::2], cmd[3::2]))
    assert options == {"--run": "topdown-xe", "--dataset": "synthetic", "--images": FOLDER,
                       "--out": "results/my_captions.json", "--html": "results/my_captions.html"}
    options.update({"--out": str(out / "captions.json"), "--html": str(out / "page.html")})
    proc = subprocess.run([sys.executable, "-m", "caprl", "caption", *itertools.chain(*options.items())], cwd=work,
                          capture_output=True, text=True, timeout=300)
    return proc, out


@e2e
def test_cli_captions_a_folder_and_names_each_broken_file(work: Path, by_hand: Any) -> None:
    proc, out = by_hand
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 2, proc.stderr
    for name, reason in BROKEN.items():
        assert sum(f"{FOLDER}/{name}: skipped, not a readable image" in w and reason in w for w in warnings) == 1
    result = read(out / "captions.json")
    check_captions(result, GOOD)
    # the same captions as the workflow's job (same checkpoint, same decode:)
    workflow = read(work / "results" / "synthetic" / "captions" / "topdown-xe.json")
    assert [c["caption"] for c in result["captions"]] == [c["caption"] for c in workflow["captions"]]
    page = (out / "page.html").read_text()
    words = sum(len(c["caption"].split()) for c in result["captions"])
    assert page.count('<figure class="word">') == words  # topdown: one attention map per word


@e2e
def test_pages_in_chromium_show_every_image_and_caption(work: Path, by_hand: Any, tmp_path: Path) -> None:
    if chromium_path() is None:
        pytest.skip("no Chromium, and it cannot be installed here (not root, or no apt-get)")
    proc, out = by_hand
    assert proc.returncode == 0, proc.stderr[-3000:]
    captions = [c["caption"] for c in read(out / "captions.json")["captions"]]
    for page, png in ((out / "page.html", tmp_path / "run.png"),
                      (work / "results" / "synthetic" / "captions" / "index.html", tmp_path / "index.png")):
        dom = png.with_suffix(".dom.html")
        screenshot(page, png, 1400, 1000, 1000, dom=dom)
        assert non_trivial(png), f"{png} is blank"
        text = visible_text(dom.read_text())
        assert all(c in text for c in captions), text[:2000]
        assert dom.read_text().count('class="thumb"') == 20


def model_and_contexts(work: Path, files: list[str]) -> tuple[Any, Any, Vocab]:
    """The topdown-xe model, its context of ``files`` (the checkpoint's backbone) and the vocabulary."""
    path = str(work / "runs" / "synthetic" / "topdown-xe" / "best.pt")
    ckpt = checkpoint.load(path)
    backbone = caption.rebuild_backbone(caption.trained_features(path, ckpt.made_from, None, None), path,
                                        dict(ckpt.module("model").shape))
    images = [caption_folder.ImageFile(f, work / FOLDER / f) for f in files]
    batch = caption_folder.BatchReader(backbone)(images)
    assert batch.pooled is not None and batch.regions is not None
    model = checkpoint.model_from_checkpoint(ckpt).eval()
    return model, model.encode(batch.pooled, batch.regions), Vocab.load(work / "data" / "synthetic" / "vocab.json")


@e2e
@pytest.mark.numerics
def test_captions_and_logprobs_are_the_models_beam_search(work: Path) -> None:
    result = read(work / "results" / "synthetic" / "captions" / "topdown-xe.json")
    model, ctx, vocab = model_and_contexts(work, GOOD)
    with torch.no_grad():
        tokens, scores = beam_search(model, ctx, beam_size=2, max_length=16)
    for k, c in enumerate(result["captions"]):
        assert c["caption"] == " ".join(vocab.decode(tokens[k, 0].tolist()))
        # the CLI's batches of images against this one (other kernels), in float32: not derived
        assert c["logprob"] == pytest.approx(float(scores[k, 0]), abs=1e-4)


@e2e
def test_command_line_decode_settings_reach_the_decoder(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "greedy.json"
    proc = caption_cli(work, "--checkpoint", "runs/synthetic/topdown-xe/best.pt", "--images", *[
        f"{FOLDER}/{f}" for f in GOOD[:6]], "--method", "greedy", "--decode", "max_length=4", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = read(out)
    assert result["made_by"]["decode"] == {**decode_section(work), "method": "greedy", "max_length": 4}
    model, ctx, vocab = model_and_contexts(work, GOOD[:6])
    with torch.no_grad():
        greedy = DECODERS.get("greedy")(model, ctx, max_length=4)[:, 0]
    assert [c["caption"] for c in result["captions"]] == [" ".join(vocab.decode(t.tolist())) for t in greedy]
    assert [c["file"] for c in result["captions"]] == [f"{FOLDER}/{f}" for f in GOOD[:6]]
    proc = caption_cli(work, "--checkpoint", "runs/synthetic/fc-xe/best.pt", "--images", FOLDER,
                       "--decode", "no_such_option=1", "--out", tmp_path / "bad.json")
    assert "decode.no_such_option" in user_error(proc, "caption")
    assert not (tmp_path / "bad.json").exists()


@e2e
def test_another_backbone_is_refused_naming_both(work: Path, tmp_path: Path) -> None:
    ckpt = "runs/synthetic/fc-xe/best.pt"
    proc = caption_cli(work, "--checkpoint", ckpt, "--images", FOLDER, "--backbone", "patches",
                       "--out", tmp_path / "a.json")
    err = user_error(proc, "caption")
    assert f"--backbone patches: {ckpt} was trained on tinycnn features" in err
    patches = tiny_files(tmp_path / "patches")["features.h5"]  # another dataset's patches features
    proc = caption_cli(work, "--checkpoint", ckpt, "--images", FOLDER, "--features", patches,
                       "--out", tmp_path / "b.json")
    err = user_error(proc, "caption")
    assert f"{ckpt} was trained on other features than {patches}" in err
    assert f"backbone 'tinycnn' in {ckpt}, 'patches' in {patches}" in err
    assert not list(tmp_path.glob("*.json"))


@e2e
def test_a_video_checkpoint_is_refused(work: Path, tmp_path: Path) -> None:
    ckpt = checkpoint.load(work / "runs" / "synthetic" / "fc-xe" / "best.pt")
    ckpt.run["dataset"] = "synthetic_video"  # the built-in video set (format tgif), as its runs record it
    video = tmp_path / "video.pt"
    checkpoint.save(video, ckpt)
    err = user_error(caption_cli(work, "--checkpoint", video, "--images", FOLDER, "--out", tmp_path / "v.json"),
                     "caption")
    assert f"{video} is a video model (dataset synthetic_video, format tgif)" in err


def test_pages_escape_what_they_show(tmp_path: Path) -> None:
    image = tmp_path / "a&b.png"
    next(synthetic.generate({"n_train": 0, "n_val": 0, "n_test": 1, "image_size": 32, "max_objects": 1},
                            seed=1)).image.save(image)
    evil = '<script>alert("x")</script> & more'
    entry = {"file": image.name, "path": str(image), "caption": evil, "logprob": -1.0}
    result = {"captions": [entry], "skipped": [{"file": "<b>.jpg", "path": "<b>.jpg", "reason": "<i>"}],
              "made_by": {"run": "<run>"}}
    page = caption_page.run_page(result, [{**entry, "words": evil.split(), "attention": None}], grid=3)
    assert evil not in page and "<script>" not in page and "<b>" not in page
    assert html.unescape(page).count(evil) == 1 and "a&amp;b.png" in page
    other = {**result, "captions": [{**entry, "file": "c.png"}]}
    with pytest.raises(CaprlError, match="y.json and x.json captioned different images"):
        caption_page.compare_page([result, other], ["x.json", "y.json"])



@e2e
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_same_captions(work: Path, tmp_path: Path) -> None:
    """The model (and its decode, replayed from CUDA graphs) on the GPU: the CPU's captions."""
    proc = caption_cli(work, "--checkpoint", "runs/synthetic/topdown-xe/best.pt", "--images", FOLDER,
                       "--device", "cuda", "--out", tmp_path / "gpu.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    gpu, cpu = read(tmp_path / "gpu.json"), read(work / "results" / "synthetic" / "captions" / "topdown-xe.json")
    assert [c["caption"] for c in gpu["captions"]] == [c["caption"] for c in cpu["captions"]]
    assert [c["logprob"] for c in gpu["captions"]] == pytest.approx([c["logprob"] for c in cpu["captions"]], abs=1e-3)
