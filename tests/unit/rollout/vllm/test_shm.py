"""rollout/vllm/shm.py's engine keeps what an update loaded, so that a load that leaves parameters out (vLLM's
reload only logs it) is reported: a fake model stands for vLLM's, whose ``load_weights`` says what it loaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpolab.rollout.vllm import shm as vllm_shm


class FakeModel(torch.nn.Module):
    """vLLM's model contract: ``load_weights`` returns the names of the parameters it loaded."""

    def __init__(self, says_what_it_loaded: bool = True):
        super().__init__()
        self.a = torch.nn.Linear(2, 2, bias=False)
        self.b = torch.nn.Linear(2, 2, bias=False)
        self.says = says_what_it_loaded

    def load_weights(self, weights):
        names = set()
        for name, t in weights:
            self.get_parameter(name).data.copy_(t)
            names.add(name)
        return names if self.says else None


def test_unloaded_names_the_parameters_left_out():
    m = FakeModel()
    assert vllm_shm.unloaded(m, {"a.weight"}) == ["b.weight"]
    assert vllm_shm.unloaded(m, {"a.weight", "b.weight"}) == []
    assert vllm_shm.unloaded(m, None) is None  # not tracked
    m.b = torch.nn.Module()  # a LoRA server's layer: vLLM's wrapper holds it as base_layer, loaded as "b.weight"
    m.b.base_layer = torch.nn.Linear(2, 2, bias=False)
    assert vllm_shm.unloaded(m, {"a.weight", "b.weight"}) == [] and vllm_shm.unloaded(m, {"a.weight"}) == ["b.weight"]


@pytest.mark.parametrize(("says", "quantization", "missing"), [(True, None, ["b.weight"]), (False, None, None), (True, "fp8", None)])
def test_the_engine_reports_what_an_update_left_out(tmp_path, monkeypatch, says, quantization, missing):
    pytest.importorskip("vllm", reason="vLLM is not installed (make test installs it)")
    import vllm.model_executor.model_loader.reload as reload

    monkeypatch.setattr(reload, "initialize_layerwise_reload", lambda model: None)  # vLLM's own machinery, not
    monkeypatch.setattr(reload, "finalize_layerwise_reload", lambda model, config: None)  # under test here
    monkeypatch.setattr(vllm_shm, "SHM_ROOT", tmp_path)
    model = FakeModel(says)
    config = SimpleNamespace(parallel_config=None, model_config=SimpleNamespace(quantization=quantization))
    engine = vllm_shm.engine_class()(None, config, torch.device("cpu"), model)
    engine.init_transfer_engine(engine.init_info_cls(folder="grpolab-t"))
    (tmp_path / "grpolab-t").mkdir()
    engine.start_weight_update()
    info = vllm_shm.write_bucket(tmp_path / "grpolab-t" / "bucket-0", [("a.weight", torch.full((2, 2), 3.0))])
    engine.update_weights(info)
    assert engine.missing is None  # known at the end of the update only
    engine.finish_weight_update()
    assert engine.missing == missing and torch.equal(model.a.weight, torch.full((2, 2), 3.0))
    engine.start_weight_update()  # the next update starts its own count
    engine.update_weights(vllm_shm.write_bucket(tmp_path / "grpolab-t" / "bucket-1", list(model.named_parameters())))
    engine.finish_weight_update()
    assert engine.missing == (None if missing is None else [])
