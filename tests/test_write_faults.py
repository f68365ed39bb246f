"""Write faults (issue 23): a full disk, a used-up quota or a file-size limit met by the real stages.

Each stage runs as a real subprocess under ``ulimit -f`` (a write past the limit fails with
EFBIG, "File too large"; SIGXFSZ is ignored, so the process gets the error instead of being
killed; reading is not limited). Each must end with one line ``caprl <stage>: error: could not
write <file> (File too large): ...``, exit 2 (no traceback, no segmentation fault), leave the
previous output as it was and no temporary file behind:

1. ``caprl merge-features`` (HDF5 used to crash the process at exit);
2. ``caprl train``, when a checkpoint cannot be saved (torch's message used to be all there was);
   the last good state stays, and the re-run resumes from it;
3. ``caprl evaluate``, when pycocoevalcap's PTB tokenizer cannot write its temporary file;
4. ``caprl features``, whose writer closes HDF5 itself (the CLI's last line of defence).

Then the mapping of the errors themselves (:mod:`caprl.errors`, :mod:`caprl.io`).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from caprl import io
from caprl.errors import WriteError
from pipeline_data import DatasetPaths, caprl_command
from stage_inputs import degenerate_checkpoint, temporaries

TOO_LARGE = os.strerror(errno.EFBIG)  # "File too large"
NO_TRACKING = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}  # refused at once: tracking off, no MLflow writes


def limited(cmd: list[str], kib: int, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``cmd`` run as ``bash -c 'ulimit -f KIB; exec CMD'``, SIGXFSZ ignored (so writes fail with EFBIG)."""
    return subprocess.run(["bash", "-c", f'ulimit -f {kib} && exec "$@"', "bash", *cmd], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))


def write_fault(proc: subprocess.CompletedProcess[str], stage: str, path: Path | str) -> str:
    """The last stderr line of a stage stopped by a write fault of ``path``: exit 2, no traceback."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, f"exit code {proc.returncode}:\n{output[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"caprl {stage}: error: could not write {path} ({TOO_LARGE}): "), last
    assert "`ulimit -f`" in last and re.search(r"; free \d+ MB on its filesystem", last), last
    return last


@pytest.fixture(scope="module")
def dataset(research_dataset: DatasetPaths) -> DatasetPaths:
    return research_dataset


# -- 1. merge-features -------------------------------------------------------------------------

def test_merge_features_on_a_full_disk_keeps_the_old_file_and_exits_2(dataset: DatasetPaths, tmp_path: Path) -> None:
    shard = dataset.workdir / "data/synthetic/features/tinycnn/shard0.h5"  # 2.6 MB: the merged file is as big
    out = tmp_path / "features.h5"
    out.write_bytes(dataset.features.read_bytes()[:1000] + b"the old features file")
    old = out.read_bytes()
    proc = limited(caprl_command("merge-features", dataset.params, "--annotations", dataset.annotations,
                                 "--shards", shard, "--out", out), 200, tmp_path)
    last = write_fault(proc, "merge-features", out)
    assert "the previous file is unchanged" in last
    assert out.read_bytes() == old and temporaries(tmp_path) == []

    # the library call alike, and HDF5 holds no file at exit (its teardown used to segfault)
    script = textwrap.dedent(f"""
        import h5py
        from caprl.errors import WriteError
        from caprl.features.merge import merge_shards
        try:
            merge_shards([{str(shard)!r}], {str(out)!r})
        except WriteError as exc:
            print("WriteError:", exc)
        print("open:", len(h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)))
    """)
    proc = limited([sys.executable, "-c", script], 200, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert f"WriteError: could not write {out} ({TOO_LARGE})" in proc.stdout and "open: 0" in proc.stdout
    assert out.read_bytes() == old and temporaries(tmp_path) == []


# -- 2. train ----------------------------------------------------------------------------------

def test_train_that_cannot_save_its_state_keeps_the_last_good_one_and_resumes_from_it(
        dataset: DatasetPaths, tmp_path: Path) -> None:
    init = degenerate_checkpoint(dataset, "fc-xe", "xe", "a", path=tmp_path / "init.pt")
    state = tmp_path / "run" / "state"
    cmd = caprl_command("train", dataset.params, "--dataset", "synthetic", "--run", "fc-scst", *dataset.train_args(),
                        "--init", f"model={init}", "--checkpoint", tmp_path / "run/best.pt",
                        "--history", tmp_path / "run/history.json", "--state-dir", state)
    # 150 KiB: the step-0 state (no optimiser moments yet, ~75 KB) fits, the state at step 3 (~210 KB) does not
    proc = limited(cmd, 150, dataset.workdir, NO_TRACKING)
    last = write_fault(proc, "train", state / "last.pt")
    assert "the previous file is unchanged" in last
    good = (state / "last.pt").read_bytes()
    assert temporaries(state) == [] and not (tmp_path / "run/best.pt").exists()

    proc = limited(cmd, 150, dataset.workdir, NO_TRACKING)  # the re-run resumes from it (and fails alike)
    assert f"resumed from {state / 'last.pt'} at epoch 0, batch 0 (step 0)" in proc.stderr, proc.stderr[-4000:]
    write_fault(proc, "train", state / "last.pt")
    assert (state / "last.pt").read_bytes() == good and temporaries(state) == []


# -- 3. evaluate -------------------------------------------------------------------------------

def test_evaluate_names_the_tokenizers_temporary_file_and_its_folder(dataset: DatasetPaths, tmp_path: Path) -> None:
    import pycocoevalcap.tokenizer.ptbtokenizer as ptb

    folder = Path(ptb.__file__).parent
    ckpt = degenerate_checkpoint(dataset, "fc-xe", "xe", "a", path=tmp_path / "fc-xe.pt")
    out = tmp_path / "results"
    out.mkdir()
    olds = {name: f"old {name}\n" for name in ("captions.json", "scores.json", "examples.json")}
    for name, text in olds.items():
        (out / name).write_text(text)
    # 2 KiB: the references and captions the tokenizer is given (~4 KB) do not fit
    proc = limited(caprl_command("evaluate", dataset.params, "--dataset", "synthetic", "--run", "fc-xe",
                                 "--checkpoint", ckpt, "--annotations", dataset.annotations, "--vocab", dataset.vocab,
                                 "--labels", dataset.labels, "--features", dataset.features,
                                 "--refs", dataset.references["test"], "--out-captions", out / "captions.json",
                                 "--out-scores", out / "scores.json", "--out-examples", out / "examples.json"),
                   2, dataset.workdir, NO_TRACKING)
    assert proc.returncode == 2, proc.stderr[-4000:]
    tmp_file = re.search(rf"temporary file ({re.escape(str(folder))}/\S+) \(", proc.stderr.splitlines()[-1])
    assert tmp_file, proc.stderr[-3000:]
    last = write_fault(proc, "evaluate", f"the PTB tokenizer's temporary file {tmp_file[1]}")
    assert f"writes this file in its own package folder {folder}, whatever TMPDIR says" in last
    assert not Path(tmp_file[1]).exists()  # pycocoevalcap leaves it there; caprl removes it
    assert {name: (out / name).read_text() for name in olds} == olds and temporaries(out) == []


# -- 4. a stage whose HDF5 writer is not caprl.io.atomic_hdf5 ----------------------------------

def test_features_on_a_full_disk_exits_2_not_with_a_segfault(dataset: DatasetPaths, tmp_path: Path) -> None:
    out = tmp_path / "shard0.h5"
    proc = limited(caprl_command("features", dataset.params, "--dataset", "synthetic", "--annotations",
                                 dataset.annotations, "--image-root", dataset.workdir / "data/raw/synthetic/images",
                                 "--shard", "0", "--out", out), 200, dataset.workdir)
    last = write_fault(proc, "features", out)
    assert "nothing was left in its place" in last
    assert not out.exists() and temporaries(tmp_path) == []


# -- the errors ---------------------------------------------------------------------------------

REMEDY = {errno.ENOSPC: "its filesystem is full", errno.EDQUOT: "your disk quota there is used up",
          errno.EFBIG: "larger than its filesystem allows", errno.EROFS: "mounted read-only",
          errno.EACCES: "you may not write in"}


@pytest.mark.parametrize("code", sorted(REMEDY), ids=[errno.errorcode[c] for c in sorted(REMEDY)])
def test_a_failed_write_is_a_write_error_naming_file_cause_and_free_space(tmp_path: Path, code: int) -> None:
    target = tmp_path / "out" / "scores.json"
    io.write_text(target, "old\n")
    with pytest.raises(WriteError) as caught:
        with io.atomic_path(target) as tmp:
            tmp.write_text("new, half written")
            raise OSError(code, os.strerror(code))  # what the write (or fsync) of a full disk raises
    message = str(caught.value)
    assert message.startswith(f"could not write {target} ({os.strerror(code)}): ") and REMEDY[code] in message
    assert re.search(r"; free \d+ MB on its filesystem; the previous file is unchanged$", message), message
    assert caught.value.errno == code and caught.value.path == target
    assert target.read_text() == "old\n" and temporaries(target.parent) == []


def test_the_errors_of_hdf5_and_of_other_files() -> None:
    hdf5 = RuntimeError("Can't close dataset (file write failed: time = Wed Nov 25 05:24:59 2026\n, filename = "
                        "'/d/.f.h5.1@h~ab.tmp', file descriptor = 4, errno = 28, error message = 'No space left "
                        "on device', buf = 0x5, total write size = 4728, bytes this sub-write = 4728, offset = 0)")
    assert io.write_cause(hdf5) == (errno.ENOSPC, "/d/.f.h5.1@h~ab.tmp")
    wrapped = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    wrapped.__context__ = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))  # torch's zip writer over a Python file
    assert io.write_cause(wrapped) == (errno.EDQUOT, None)
    assert io.write_cause(ValueError("errno = 3")) is None
    # outside atomic writes (the CLI): a disk error names its file; a permission error may be a read's
    error = io.write_error(OSError(errno.EFBIG, TOO_LARGE, "/d/log.txt"))
    assert error is not None and str(error).startswith(f"could not write /d/log.txt ({TOO_LARGE}): ")
    assert io.write_error(PermissionError(errno.EACCES, "Permission denied", "/d/in.json")) is None


def test_an_input_that_cannot_be_read_is_not_reported_as_the_outputs_write(tmp_path: Path) -> None:
    with pytest.raises(PermissionError):
        with io.atomic_path(tmp_path / "out.json"):
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "input.json"))
    assert temporaries(tmp_path) == []


def test_a_copy_that_does_not_fit_names_its_destination(tmp_path: Path) -> None:
    """shutil.copyfile's error names the source first (``caprl train`` copies best.pt so)."""
    source, out = tmp_path / "state" / "best.pt", tmp_path / "best.pt"
    source.parent.mkdir()
    source.write_bytes(os.urandom(200_000))
    script = textwrap.dedent(f"""
        import resource, shutil
        from caprl import io
        from caprl.errors import WriteError
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            with io.atomic_path({str(out)!r}) as tmp:
                shutil.copyfile({str(source)!r}, tmp)
        except WriteError as exc:
            print("WriteError:", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"WriteError: could not write {out} ({TOO_LARGE}): "), proc.stdout
    assert not out.exists() and temporaries(tmp_path) == []


def test_a_hidden_cause_is_guessed_from_the_file_size_limit(tmp_path: Path) -> None:
    """torch.save to a path hides the OSError ("unexpected pos"): the file at the limit says EFBIG."""
    script = textwrap.dedent(f"""
        import resource, torch
        from caprl.io import guess_write_errno
        from pathlib import Path
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        path = Path({str(tmp_path / "x.pt")!r})
        try:
            torch.save({{"w": torch.zeros(100_000)}}, path)
        except RuntimeError as exc:
            print("torch:", exc)
        print("guess:", guess_write_errno(path))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "unexpected pos" in proc.stdout and f"guess: {errno.EFBIG}" in proc.stdout, proc.stdout
