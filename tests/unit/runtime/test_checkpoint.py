"""The checkpoint manifest (runtime/checkpoint.py)."""

from __future__ import annotations

from grpolab.runtime import checkpoint as ckpt


def test_manifest_catches_a_changed_size_and_a_changed_byte(tmp_path):
    (tmp_path / "trainer_state.pt").write_bytes(b"abcdef")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(b"123")
    ckpt.write_manifest(tmp_path)
    assert ckpt.verify_checkpoint(tmp_path) is None
    (tmp_path / "sub" / "w.bin").write_bytes(b"124")
    assert ckpt.verify_checkpoint(tmp_path) == "sub/w.bin does not match its checksum"
    (tmp_path / "sub" / "w.bin").write_bytes(b"123")
    (tmp_path / "trainer_state.pt").write_bytes(b"abc")
    assert ckpt.verify_checkpoint(tmp_path) == "trainer_state.pt has 3 bytes, 6 were written"
    (tmp_path / "trainer_state.pt").unlink()
    assert ckpt.verify_checkpoint(tmp_path) == "trainer_state.pt is missing"
