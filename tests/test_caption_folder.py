"""``caprl caption`` on folders as users have them: more images than one batch, files it cannot
read, outputs it cannot write.

The checkpoint is a real one (a topdown model, seeded, its weights scaled so that its captions
differ from image to image) of the TINY synthetic set made by the real stages, with the
features record a trained run keeps; the command runs as users run it (a subprocess), except
where a test counts the images the command holds (then its ``main`` runs in this process, the
image loader it calls wrapped by a counter). Where the tests run as root, a file without read
permission is read by the command with root's permission to read anything dropped (``setpriv``).
"""

from __future__ import annotations

import argparse
import base64
import io as bytes_io
import json
import os
import re
import shutil
import subprocess
import threading
import weakref
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import yaml
from PIL import Image

from caprl.data import synthetic
from caprl.data.feature_store import open_features_file
from caprl.data.vocab import Vocab
from caprl.decoding import captured
from caprl.errors import CaprlError
from caprl.evaluation import caption, caption_folder, caption_page
from caprl.io import provenance
from caprl.models import build_model, checkpoint
from pipeline_data import DatasetPaths, caprl_command
from screenshot import chromium_path, screenshot, visible_text
from stage_inputs import temporaries, user_error

N_IMAGES, BATCH = 30, 4
LARGE = {3: (640, 480), 17: (300, 900)}  # images shown larger than the page's thumbnails
#: the data URIs of a page's images
EMBEDDED = re.compile(r'src="data:image/(?:png|jpeg);base64,([A-Za-z0-9+/=]+)"')
#: root reads any file: the command runs without that power (see the module's docstring)
UNPRIVILEGED = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
                "--inh-caps", "-dac_override,-dac_read_search"]


@pytest.fixture(scope="module")
def dataset(research_dataset: DatasetPaths) -> DatasetPaths:
    return research_dataset


@pytest.fixture(scope="module")
def ckpt(dataset: DatasetPaths) -> Path:
    """A topdown-xe checkpoint (attention over the tinycnn grid) that records its features as a
    trained run's does."""
    path = dataset.workdir / "caption_folder" / "topdown.pt"
    if path.exists():
        return path
    vocab = Vocab.load(dataset.vocab)
    with open_features_file(dataset.features) as h5:
        features = provenance.features_record(dict(h5.attrs))
    options = {k: v for k, v in yaml.safe_load(dataset.params.read_text())["models"]["topdown"].items() if k != "arch"}
    torch.manual_seed(0)
    model = build_model("topdown", options, len(vocab), features["dim"], features["n_regions"])
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # captions that differ between images
    checkpoint.save(path, checkpoint.Checkpoint(
        run={"name": "topdown-xe", "dataset": "synthetic", "method": "xe", "model": "topdown", "options": {},
             "init": {}},
        modules={"model": checkpoint.model_record(model, "topdown")}, vocab_sha256=vocab.sha256,
        made_from={"dataset": "synthetic", "features": features}))
    return path


def write_images(folder: Path, n: int, seed: int = 7) -> list[str]:
    """``n`` generated images (a few of them large), their names in order."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"n_train": 0, "n_val": 0, "n_test": n, "image_size": 64, "max_objects": 2}
    names = []
    for k, sample in enumerate(synthetic.generate(cfg, seed=seed, dataset="caption_folder")):
        image = sample.image.resize(LARGE[k], Image.Resampling.BILINEAR) if k in LARGE else sample.image
        names.append(f"img{k:02d}.{'jpg' if k in LARGE else 'png'}")
        image.save(folder / names[-1])
    return names


def caption_cli(dataset: DatasetPaths, ckpt: Path, *args: Any, prefix: tuple[str, ...] = ()
                ) -> subprocess.CompletedProcess[str]:
    cmd = [*prefix, *caprl_command("caption", dataset.params, "--checkpoint", ckpt, *args)]
    return subprocess.run(cmd, cwd=dataset.workdir, capture_output=True, text=True, timeout=300)


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def without_scores(page: str) -> str:
    """``page`` without the numbers a batch of another size may round differently: the scores and
    the pixels of the attention maps (the thumbnails and every word stay)."""
    return re.sub(r'(<figure class="word"><img src=")[^"]*', r"\1", re.sub(r"log p = -?[0-9.]+", "", page))


@pytest.fixture(scope="module")
def folder(dataset: DatasetPaths) -> tuple[Path, list[str]]:
    path = dataset.workdir / "caption_folder" / "many"
    return path, write_images(path, N_IMAGES)


@pytest.fixture(scope="module")
def batched(dataset: DatasetPaths, ckpt: Path, folder: Any) -> dict[int, Path]:
    """The folder captioned with batches of BATCH images and in one batch: each run's output folder."""
    outs = {}
    for size in (BATCH, N_IMAGES):
        out = dataset.workdir / "caption_folder" / f"batch{size}"
        proc = caption_cli(dataset, ckpt, "--images", folder[0], "--batch-size", size, "--out", out / "captions.json",
                           "--html", out / "page.html")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"{N_IMAGES} image files" in proc.stderr and f"{size} per batch" in proc.stderr
        outs[size] = out
    return outs


def test_batches_give_the_one_batch_captions_and_page(batched: dict[int, Path], folder: Any) -> None:
    small, one = (read(batched[size] / "captions.json") for size in (BATCH, N_IMAGES))
    assert [c["file"] for c in small["captions"]] == folder[1]
    assert [(c["file"], c["caption"]) for c in small["captions"]] == [(c["file"], c["caption"])
                                                                      for c in one["captions"]]
    assert [c["logprob"] for c in small["captions"]] == pytest.approx([c["logprob"] for c in one["captions"]],
                                                                     abs=1e-4)
    assert len({c["caption"] for c in small["captions"]}) > N_IMAGES // 2  # it captions each image
    assert small["skipped"] == [] and small["made_by"] == one["made_by"]
    pages = [without_scores((batched[size] / "page.html").read_text()) for size in (BATCH, N_IMAGES)]
    assert pages[0] == pages[1]
    assert f"Captions of run topdown-xe: {N_IMAGES} images" in pages[0]


def test_the_page_embeds_thumbnails_only(batched: dict[int, Path]) -> None:
    """Every image of the page, the large ones too, is at most THUMBNAIL pixels on its longer side."""
    page = (batched[BATCH] / "page.html").read_text()
    assert page.count('<img class="thumb"') == N_IMAGES
    sides = []
    for data in EMBEDDED.findall(page):
        with Image.open(bytes_io.BytesIO(base64.b64decode(data))) as img:
            sides.append(max(img.size))
    assert len(sides) > N_IMAGES  # thumbnails and each word's attention map (topdown)
    assert max(sides) <= caption_page.THUMBNAIL
    for k, size in LARGE.items():  # the large images shrunk to the thumbnail's side
        assert f'alt="img{k:02d}.jpg"' in page


class LiveImages:
    """Wraps the image loader ``caprl caption`` calls: how many images it read, and the most it
    held at once (an image is let go when nothing refers to it any more)."""

    def __init__(self, read: Callable[[Path], Image.Image]) -> None:
        self.read, self.lock, self.live, self.peak, self.reads = read, threading.Lock(), 0, 0, 0

    def __call__(self, path: Path) -> Image.Image:
        image = self.read(path)
        with self.lock:
            self.live += 1
            self.reads += 1
            self.peak = max(self.peak, self.live)
        weakref.finalize(image, self._gone)
        return image

    def _gone(self) -> None:
        with self.lock:
            self.live -= 1


def test_at_most_one_batch_of_images_is_held_and_each_is_read_once(
        dataset: DatasetPaths, ckpt: Path, folder: Any, batched: dict[int, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", nargs="+")
    caption.add_arguments(parser)
    args = parser.parse_args(["--params", str(dataset.params), "--checkpoint", str(ckpt), "--images", str(folder[0]),
                              "--batch-size", str(BATCH), "--out", str(tmp_path / "c.json"),
                              "--html", str(tmp_path / "c.html")])
    counter = LiveImages(caption_folder.read_image)
    monkeypatch.setattr(caption_folder, "read_image", counter)
    monkeypatch.chdir(dataset.workdir)
    threads = torch.get_num_threads()
    try:
        caption.main(args)
    finally:
        torch.set_num_threads(threads)
        captured.set_enabled(True)
    assert counter.reads == N_IMAGES  # once each (no pass that reads them all first)
    assert 1 <= counter.peak <= BATCH, counter.peak
    assert read(tmp_path / "c.json")["captions"] == read(batched[BATCH] / "captions.json")["captions"]


# --- files it cannot read -------------------------------------------------------------------


def make_loop(folder: Path) -> None:
    (folder / "loop_a.png").symlink_to("loop_b.png")
    (folder / "loop_b.png").symlink_to("loop_a.png")


def make_folder_named_png(folder: Path) -> None:
    (folder / "album.png").mkdir()
    shutil.copy(folder / "img00.png", folder / "album.png" / "inside.png")  # captioned: an image in a folder


def make_truncated(folder: Path) -> None:
    png = (folder / "img01.png").read_bytes()
    (folder / "truncated.png").write_bytes(png[: len(png) // 2])


def make_broken_link(folder: Path) -> None:
    (folder / "gone.jpg").symlink_to("no_such_image.jpg")


def make_fifo(folder: Path) -> None:
    os.mkfifo(folder / "pipe.png")  # opening it would wait for a writer for ever


#: file -> how it is made, and what its reason says
UNREADABLE: dict[str, tuple[Callable[[Path], None], str]] = {
    "loop_a.png": (make_loop, "a symbolic link loop (OSError: [Errno 40] Too many levels of symbolic links"),
    "album.png": (make_folder_named_png, "a folder, not an image file (IsADirectoryError: [Errno 21] Is a directory"),
    "truncated.png": (make_truncated, "image file is truncated"),
    "gone.jpg": (make_broken_link, "a broken symbolic link to no_such_image.jpg (FileNotFoundError"),
    "pipe.png": (make_fifo, "not a regular file (a FIFO)"),
}


@pytest.fixture(scope="module")
def unreadable(dataset: DatasetPaths, ckpt: Path) -> tuple[subprocess.CompletedProcess[str], Path, list[str]]:
    """A folder of 5 images and every kind of file it cannot read, captioned: the process, its
    output folder, the good files' names."""
    folder = dataset.workdir / "caption_folder" / "unreadable"
    good = write_images(folder, 5, seed=3)
    for make, _ in UNREADABLE.values():
        make(folder)
    out = dataset.workdir / "caption_folder" / "unreadable_out"
    proc = caption_cli(dataset, ckpt, "--images", folder, "--batch-size", 3, "--out", out / "captions.json",
                       "--html", out / "page.html")
    return proc, out, sorted([*good, "album.png/inside.png"])


@pytest.mark.parametrize("name", UNREADABLE)
def test_a_file_it_cannot_read_is_listed_with_the_reason_and_the_rest_captioned(unreadable: Any, name: str) -> None:
    proc, out, good = unreadable
    assert proc.returncode == 0, proc.stderr[-3000:]
    reason = UNREADABLE[name][1]
    result = read(out / "captions.json")
    assert [c["file"] for c in result["captions"]] == good
    assert all(c["caption"] for c in result["captions"])
    (entry,) = [s for s in result["skipped"] if s["file"] == name]
    assert reason in entry["reason"] and entry["path"].endswith(f"unreadable/{name}")
    (warning,) = [line for line in proc.stderr.splitlines() if f"unreadable/{name}: skipped" in line]
    assert " WARNING " in warning and reason in warning
    page = (out / "page.html").read_text()
    assert f"<li><code>{name}</code>: " in page and caption_page.e(reason) in page


def test_the_page_shows_what_was_skipped_and_why(unreadable: Any, tmp_path: Path) -> None:
    proc, out, good = unreadable
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = read(out / "captions.json")
    assert {s["file"] for s in result["skipped"]} == {*UNREADABLE, "loop_b.png"}
    if chromium_path() is None:
        pytest.skip("no Chromium, and it cannot be installed here (not root, or no apt-get)")
    dom = tmp_path / "page.dom.html"
    screenshot(out / "page.html", tmp_path / "page.png", 1400, 1000, 1000, dom=dom)
    text = visible_text(dom.read_text())
    assert f"Skipped: {len(result['skipped'])} unreadable file(s)" in text
    for s in result["skipped"]:
        assert " ".join(f"{s['file']} : {s['reason']}".split()) in text  # <code>file</code>: reason
    assert all(c["caption"] in text for c in result["captions"])


def root_reads_anything() -> bool:
    return os.geteuid() == 0


def unprivileged() -> tuple[str, ...]:
    """The command prefix that takes root's power to read and write any file away (nothing for
    another user); a skip where that cannot be done."""
    if not root_reads_anything():
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, and no setpriv to drop root's power to read any file")
    probe = subprocess.run([*UNPRIVILEGED, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"running as root, and setpriv cannot drop its capabilities here: {probe.stderr.strip()}")
    return tuple(UNPRIVILEGED)


def test_a_file_without_read_permission_is_skipped(dataset: DatasetPaths, ckpt: Path, tmp_path: Path) -> None:
    prefix = unprivileged()
    folder = tmp_path / "images"
    good = write_images(folder, 3, seed=5)
    secret = folder / "secret.png"
    shutil.copy(folder / good[0], secret)
    secret.chmod(0)
    proc = caption_cli(dataset, ckpt, "--images", folder, "--out", tmp_path / "c.json", prefix=prefix)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = read(tmp_path / "c.json")
    assert [c["file"] for c in result["captions"]] == good
    (entry,) = result["skipped"]
    assert entry["file"] == "secret.png"
    assert entry["reason"].startswith("no permission to read it (PermissionError: [Errno 13] Permission denied")


def test_a_folder_of_nothing_readable_writes_nothing(dataset: DatasetPaths, ckpt: Path, tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    make_broken_link(folder)
    (folder / "notes.jpg").write_text("not a JPEG\n")
    proc = caption_cli(dataset, ckpt, "--images", folder, "--out", tmp_path / "out" / "c.json",
                       "--html", tmp_path / "out" / "c.html")
    assert user_error(proc, "caption").endswith(f"--images {folder}: none of the 2 files is a readable image; "
                                                "nothing was written")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


# --- both outputs or neither --------------------------------------------------------------


def test_a_page_path_in_a_file_leaves_no_json(dataset: DatasetPaths, ckpt: Path, folder: Any,
                                              tmp_path: Path) -> None:
    (tmp_path / "results").write_text("a file, not a folder\n")
    page = tmp_path / "results" / "page.html"
    proc = caption_cli(dataset, ckpt, "--images", folder[0], "--out", tmp_path / "c.json", "--html", page)
    assert user_error(proc, "caption").endswith(
        f"--html {page}: {tmp_path / 'results'} is a file, not a folder, so it cannot hold page.html; give a path "
        "in a folder; nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


@pytest.mark.parametrize("option", ["--html", "--out"])
def test_a_folder_at_an_output_path_leaves_the_other_as_it_was(dataset: DatasetPaths, ckpt: Path, folder: Any,
                                                               tmp_path: Path, option: str) -> None:
    paths = {"--out": tmp_path / "c.json", "--html": tmp_path / "c.html"}
    paths[option].mkdir()
    other = paths["--out" if option == "--html" else "--html"]
    other.write_text("the previous output\n")
    proc = caption_cli(dataset, ckpt, "--images", folder[0], *[str(x) for kv in paths.items() for x in kv])
    assert user_error(proc, "caption").endswith(
        f"{option} {paths[option]}: a folder is there; give a file path (e.g. {paths[option] / paths[option].name}); "
        "nothing was written")
    assert other.read_text() == "the previous output\n" and list(paths[option].iterdir()) == []
    assert temporaries(tmp_path) == []


def test_a_page_folder_it_may_not_write_in_leaves_no_json(dataset: DatasetPaths, ckpt: Path, folder: Any,
                                                          tmp_path: Path) -> None:
    prefix = unprivileged()
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages").chmod(0o555)
    try:
        proc = caption_cli(dataset, ckpt, "--images", folder[0], "--out", tmp_path / "c.json",
                           "--html", tmp_path / "pages" / "page.html", prefix=prefix)
    finally:
        (tmp_path / "pages").chmod(0o755)
    err = user_error(proc, "caption")
    assert f"{tmp_path / 'pages' / 'page.html'}" in err and f"you may not write in {tmp_path / 'pages'}" in err, err
    assert " captions (" not in proc.stderr  # refused when its temporary file could not be made, before any image
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages"] and list((tmp_path / "pages").iterdir()) == []


def test_a_json_that_cannot_be_put_in_place_takes_the_page_back(tmp_path: Path) -> None:
    """The last step can still fail (here: a folder made at the JSON's path once the work began):
    the page already put in place is removed, and the error names the path."""
    out, html = tmp_path / "c.json", tmp_path / "c.html"
    with pytest.raises(CaprlError) as raised:
        with caption.both_or_neither(str(out), str(html)) as (json_out, page):
            json_out.write("{}\n")
            assert page is not None
            page.write("<html></html>\n")
            out.mkdir()
    assert str(raised.value).startswith(f"{out}: could not be put in place (Is a directory); neither {out} nor "
                                        f"{html} was written")
    assert not html.exists() and list(out.iterdir()) == [] and temporaries(tmp_path) == []
    with caption.both_or_neither(str(tmp_path / "d.json"), None) as (json_out, page):  # no page: the JSON alone
        assert page is None
        json_out.write("{}\n")
    assert json.loads((tmp_path / "d.json").read_text()) == {}
