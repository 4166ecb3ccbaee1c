"""A checkpoint is untrusted input: no file in one may make loading run code.

Each case plants a hand-built pickle that would run a shell command (touching a marker file) in one of
the files a checkpoint holds, then resumes through the real CLI with the default `train.resume=auto`.
The run must stop with exit code 2 and one line naming the file, must not repeat PyTorch's advice to
load with weights_only=False, and the marker must not exist.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from nvfp4train.train.checkpoint import CheckpointError, SafeFileSystemReader, _MetadataUnpickler
from tests.conftest import run_train

RUN = [
    "train.max_steps=2",
    "train.save_every=2",
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=64",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
]


# --------------------------------------------------------------------------------- hostile pickles
def _str(s: str) -> bytes:
    b = s.encode()
    return (b"\x8c" + bytes([len(b)]) if len(b) < 256 else b"X" + struct.pack("<I", len(b))) + b


def _shell_payload(marker: Path, how: str, protocol: int) -> bytes:
    """A pickle that calls os.system(f"touch {marker}") when unpickled, built opcode by opcode.

    how: "global"  GLOBAL opcode naming posix.system directly
         "stack"   STACK_GLOBAL (protocol 4+) naming posix.system
         "dotted"  STACK_GLOBAL with a dotted name reaching os.system through an allowed DCP module
         "dotted_global"  the same dotted path through the GLOBAL opcode
    """
    cmd = f"touch {marker}"
    head = b"\x80" + bytes([protocol])
    if how == "global":
        fn = f"c{os.system.__module__}\nsystem\n".encode()
    elif how == "dotted_global":
        fn = b"ctorch.distributed.checkpoint.metadata\nos.system\n"
    else:
        module, name = (
            (os.system.__module__, "system")
            if how == "stack"
            else ("torch.distributed.checkpoint.filesystem", "os.system")
        )
        fn = _str(module) + _str(name) + b"\x93"
    arg = _str(cmd) if protocol >= 4 else b"X" + struct.pack("<I", len(cmd)) + cmd.encode()
    return head + fn + arg + b"\x85" + b"R" + b"."  # TUPLE1, REDUCE, STOP


class _Reduce:
    """The everyday attack: an object whose __reduce__ returns (os.system, (cmd,))."""

    def __init__(self, marker: Path):
        self.cmd = f"touch {marker}"

    def __reduce__(self):
        return os.system, (self.cmd,)


def _payloads(marker: Path):
    for protocol in (2, 4, 5):
        yield f"reduce-p{protocol}", pickle.dumps(_Reduce(marker), protocol=protocol)
    yield "global-p2", _shell_payload(marker, "global", 2)
    yield "global-p4", _shell_payload(marker, "global", 4)
    yield "stack-p4", _shell_payload(marker, "stack", 4)
    yield "stack-p5", _shell_payload(marker, "stack", 5)
    yield "dotted-p4", _shell_payload(marker, "dotted", 4)
    yield "dotted-p5", _shell_payload(marker, "dotted", 5)
    yield "dotted-global-p4", _shell_payload(marker, "dotted_global", 4)


def _torch_zip(pickled: bytes) -> bytes:
    """A file in torch.save's zip layout whose data.pkl is `pickled`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickled)
        z.writestr("archive/version", "3\n")
        z.writestr("archive/byteorder", "little")
    return buf.getvalue()


def test_payloads_really_run_code_when_unpickled_normally(tmp_path):
    """Guards the guard: every payload below does run its command under a plain unpickler."""
    for name, data in _payloads(tmp_path / "m"):
        marker = tmp_path / "m"
        pickle.loads(data)
        assert marker.exists(), name
        marker.unlink()


@pytest.mark.parametrize("case", [n for n, _ in _payloads(Path("x"))])
def test_metadata_unpickler_refuses_every_payload(tmp_path, case):
    data = dict(_payloads(tmp_path / "pwned"))[case]
    with pytest.raises(pickle.UnpicklingError, match="not allowed in a checkpoint"):
        _MetadataUnpickler(io.BytesIO(data)).load()
    assert not (tmp_path / "pwned").exists()


def test_metadata_declaring_bytes_entries_is_refused(tmp_path):
    """DCP would hand a BytesStorageMetadata entry to torch.load(weights_only=False)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

    dcp.save({"w": torch.zeros(3)}, checkpoint_id=str(tmp_path))
    (tmp_path / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={"w": BytesStorageMetadata()})))
    with pytest.raises(CheckpointError, match=r"\.metadata: refused"):
        SafeFileSystemReader(str(tmp_path)).read_metadata()


# ----------------------------------------------------------------------------- through the CLI
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "run"
    run_train(f"out_dir={out}", *RUN)
    return out


def _resume_refused(out: Path, planted: Path, marker: Path, extra=()):
    before = (out / "metrics.jsonl").read_text()
    proc = run_train(f"out_dir={out}", *RUN, "train.max_steps=4", *extra, check=False)
    assert not marker.exists(), "the planted command ran"
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert planted.name in lines[0] or str(planted.parent) in lines[0], lines[0]
    assert "weights_only" not in proc.stderr and "Traceback" not in proc.stderr
    assert (out / "metrics.jsonl").read_text() == before


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("case", ["reduce-p2", "reduce-p5", "global-p2", "stack-p4", "dotted-p4", "dotted-global-p4"])
def test_planted_metadata_is_refused_on_auto_resume(tmp_path, saved_run, case):
    out = _copy_run(saved_run, tmp_path / "run")
    marker = tmp_path / "pwned"
    planted = out / "checkpoints" / "step_00000002" / "model_optim" / ".metadata"
    planted.write_bytes(dict(_payloads(marker))[case])
    _resume_refused(out, planted, marker)


@pytest.mark.parametrize("case", ["reduce-p2", "reduce-p4", "global-p2", "dotted-p5"])
def test_planted_rank_file_is_refused_on_auto_resume(tmp_path, saved_run, case):
    out = _copy_run(saved_run, tmp_path / "run")
    marker = tmp_path / "pwned"
    planted = out / "checkpoints" / "step_00000002" / "rank_00000.pt"
    planted.write_bytes(_torch_zip(dict(_payloads(marker))[case]))
    _resume_refused(out, planted, marker)


def test_planted_tensor_data_file_is_refused_on_auto_resume(tmp_path, saved_run):
    """Point every entry of a genuine .metadata at a data file holding a payload in torch.save's layout."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    out = _copy_run(saved_run, tmp_path / "run")
    marker = tmp_path / "pwned"
    model_optim = out / "checkpoints" / "step_00000002" / "model_optim"
    md = SafeFileSystemReader(str(model_optim)).read_metadata()
    evil = _torch_zip(dict(_payloads(marker))["reduce-p2"])
    for f in model_optim.glob("*.distcp"):
        f.write_bytes(evil)
    md.storage_data = {
        k: _StorageInfo(relative_path=v.relative_path, offset=0, length=len(evil)) for k, v in md.storage_data.items()
    }
    (model_optim / ".metadata").write_bytes(pickle.dumps(md))
    _resume_refused(out, model_optim / "x.distcp", marker)


def test_planted_deepspeed_files_are_refused_on_auto_resume(tmp_path):
    pytest.importorskip("deepspeed")
    ds = ["train.parallel=deepspeed", "train.zero_stage=1"]
    out = tmp_path / "run"
    run_train(f"out_dir={out}", *RUN, *ds)
    ckpt_files = sorted((out / "checkpoints" / "step_00000002" / "deepspeed").glob("*.pt"))
    assert len(ckpt_files) >= 2  # model states and ZeRO optimizer states
    for i, planted in enumerate(ckpt_files):
        run = _copy_run(out, tmp_path / f"run{i}")
        target = run / planted.relative_to(out)
        marker = tmp_path / f"pwned{i}"
        target.write_bytes(_torch_zip(dict(_payloads(marker))["reduce-p4"]))
        _resume_refused(run, target, marker, extra=ds)
