"""Model objects in the Python API: a loaded PreTrainedModel or PeftModel as model=, save_model and
state.log_history after training (grpolab.api_models)."""

from __future__ import annotations

import json

import pytest
import torch

from grpolab.api import GRPOTrainer
from grpolab.errors import ConfigError, GrpolabError
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.runtime.logging import read_metrics

transformers = pytest.importorskip("transformers")
ROWS = [{"prompt": f"{a}+{b}="} for a in range(3) for b in range(2)]


def reward_len(completions, **kwargs):
    return [float(len(c)) for c in completions]


def reward_chars(completions, **kwargs):
    """A number that differs between two of the random model's replies 10 times in 11 (its character codes'
    sum mod 11), so the training tests get a signal whatever the random stream: the replies' lengths barely
    vary (the model almost never emits its EOS in 4 tokens), and 4 groups without spread would train nothing."""
    return [float(sum(map(ord, c)) % 11) for c in completions]


def _args(out, steps=2):
    return {
        "rollout": {"num_generations": 2, "max_completion_length": 4},
        "train": {"prompts_per_step": 2, "num_steps": steps},
        "optim": {"lr": 1e-2},
        "algo": {"beta": 0.0},
        "log": {"output_dir": str(out), "run_name": "obj", "progress": False, "checkpoint_every": 1},
    }


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_loaded_model_trains_and_save_model_writes_a_from_pretrained_folder(tiny_model_dir, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = _weights(model)
    trainer = GRPOTrainer(model, reward_funcs=reward_chars, args=_args(tmp_path), train_dataset=ROWS)
    assert trainer.args.model.tokenizer == tiny_model_dir  # read from where the model came from, as TRL does
    assert trainer.args.model.dtype == "float32"
    with pytest.raises(GrpolabError, match="holds no checkpoint.*train\\(\\) first"):
        trainer.save_model(tmp_path / "early")
    trainer.train()

    saved = trainer.save_model(tmp_path / "final")
    names = sorted(p.name for p in saved.iterdir())
    assert "config.json" in names and "model.safetensors" in names and "tokenizer_config.json" in names
    assert not any(n.startswith(("trainer_state", "manifest")) for n in names)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved)
    from_checkpoint = transformers.AutoModelForCausalLM.from_pretrained(latest_checkpoint(trainer.args.run_dir))
    after, last = _weights(reloaded), _weights(from_checkpoint)
    assert all(torch.equal(after[k], last[k]) for k in last)  # the last step's weights, copied
    assert any(not torch.equal(after[k], before[k]) for k in before)  # and they were trained
    transformers.AutoTokenizer.from_pretrained(saved)

    *history, summary = trainer.state.log_history  # the step rows, then transformers' end-of-training row
    assert [h["step"] for h in history] == [1, 2] and trainer.state.global_step == 2 and summary["step"] == 2
    assert history == read_metrics(trainer.args.run_dir) and "train_loss" in summary
    with pytest.raises(GrpolabError, match="exists and is not an empty folder"):
        trainer.save_model(saved)  # nothing is overwritten
    folder = trainer.model_folder.path
    assert folder.is_dir()
    del trainer
    import gc

    gc.collect()
    assert not folder.exists()  # the temporary copy goes with the trainer


def test_a_peft_model_trains_its_adapter_and_save_model_writes_the_adapter(tiny_model_dir, tmp_path):
    peft = pytest.importorskip("peft")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base_before = _weights(base)
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # an adapter that already holds something: it is carried over, not re-initialised
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    trainer = GRPOTrainer(model, reward_funcs=reward_chars, args=_args(tmp_path), train_dataset=ROWS)
    lora = trainer.args.model.lora
    assert (lora.enabled, lora.r, lora.alpha, lora.target_modules) == (True, 2, 4, ("q_proj", "v_proj"))
    given = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir), trainer.model_folder.path / "adapter"
    )
    b = [p for n, p in given.named_parameters() if "lora_B" in n]
    assert b and all(torch.all(p == 0.01) for p in b)
    trainer.train()

    saved = trainer.save_model(tmp_path / "adapter")
    names = sorted(p.name for p in saved.iterdir())
    assert "adapter_config.json" in names and "adapter_model.safetensors" in names and "model.safetensors" not in names
    assert json.loads((saved / "adapter_config.json").read_text())["base_model_name_or_path"] == tiny_model_dir
    fresh = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trained = peft.PeftModel.from_pretrained(fresh, saved)
    b = [p for n, p in trained.named_parameters() if "lora_B" in n]
    assert any(not torch.allclose(p, torch.full_like(p, 0.01)) for p in b)  # the adapter was trained
    unloaded = trained.unload().state_dict()  # the base without the adapter: the weights it was given
    assert unloaded.keys() == base_before.keys()
    assert all(torch.equal(unloaded[k], v) for k, v in base_before.items())


def test_what_cannot_be_taken_from_an_object_is_refused_with_the_reason(tiny_model_dir, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ConfigError, match=r"model is wrapped by DataParallel: pass the model inside it.*train.parallel"):
        GRPOTrainer(torch.nn.DataParallel(model), reward_funcs=reward_len, train_dataset=ROWS)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        with pytest.raises(ConfigError, match=r"model is wrapped by DistributedDataParallel: pass the model inside"):
            GRPOTrainer(ddp, reward_funcs=reward_len, train_dataset=ROWS)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        sharded = fully_shard(transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir), mesh=init_device_mesh("cpu", (1,)))
        with pytest.raises(ConfigError, match=r"model is sharded by FSDP2 \(fully_shard\): pass it unsharded"):
            GRPOTrainer(sharded, reward_funcs=reward_len, train_dataset=ROWS)
    finally:
        dist.destroy_process_group()
    config = type(model.config).from_dict(model.config.to_dict())
    config._name_or_path = ""  # as a config written in code has it
    built = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ConfigError, match="model was built in code .*give processing_class"):
        GRPOTrainer(built, reward_funcs=reward_len, train_dataset=ROWS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = GRPOTrainer(built, reward_funcs=reward_len, train_dataset=ROWS, processing_class=tokenizer)
    assert (trainer.model_folder.path / "tokenizer_config.json").is_file()
    with pytest.raises(ConfigError, match=r"model's weights are torch.float64: grpolab trains float32, bfloat16"):
        GRPOTrainer(built.to(torch.float64), reward_funcs=reward_len, train_dataset=ROWS, processing_class=tokenizer)
    peft = pytest.importorskip("peft")
    two = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir), peft.LoraConfig(r=2))
    two.add_adapter("second", peft.LoraConfig(r=2))
    with pytest.raises(ConfigError, match="PeftModel with 2 adapters .*grpolab trains one"):
        GRPOTrainer(two, reward_funcs=reward_len, train_dataset=ROWS)
    one = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir), peft.LoraConfig(r=2))
    with pytest.raises(ConfigError, match="peft_config is given: its adapter is trained; drop peft_config"):
        GRPOTrainer(one, reward_funcs=reward_len, train_dataset=ROWS, peft_config=peft.LoraConfig(r=2))


def test_a_model_whose_config_carries_a_quantization_config_is_refused_when_the_trainer_is_made(tiny_model_dir):
    """Saved with it, the run would load the weights quantized and fail in train(): refused at construction."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    with pytest.raises(ConfigError, match=r"model's config carries a quantization config \(bitsandbytes\).*load it unquantized"):
        GRPOTrainer(model, reward_funcs=reward_len, train_dataset=ROWS)


def test_a_lora_on_parameters_trains_as_given_and_from_a_peft_config(tmp_path):
    """peft's target_parameters (LoRA on a Mixture-of-Experts' stacked expert weights, TRL's MoE PEFT test): a
    PeftModel carrying one trains its adapter, the base weights untouched; a peft_config asking for one is
    model.lora.target_parameters; vLLM, whose LoRA adapts modules, is refused in one line."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from grpolab.tasks.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    config = Qwen3MoeConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_experts=2, num_experts_per_tok=1)  # fmt: skip
    lora = LoraConfig(target_modules=[], target_parameters=["mlp.experts.down_proj"])
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_config(config), lora)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(model, reward_chars, _args(tmp_path), ROWS, processing_class=tok)
    assert (trainer.args.model.lora.target_modules, trainer.args.model.lora.target_parameters) == ((), ("mlp.experts.down_proj",))
    trainer.train()
    after = dict(trainer.model.named_parameters())
    adapter = [n for n in before if "lora_" in n]
    assert adapter and any(not torch.equal(before[n], after[n]) for n in adapter if "lora_B" in n)
    assert all(torch.equal(before[n], after[n]) for n in before if "lora_" not in n)  # the base is the reference
    tok.save_pretrained(tmp_path / "base")
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "base")
    made = GRPOTrainer(str(tmp_path / "base"), reward_len, _args(tmp_path), ROWS, peft_config=lora)
    assert made.args.model.lora.target_parameters == ("mlp.experts.down_proj",)
    assert type(made.model.get_base_model().model.layers[0].mlp.experts).__name__ == "ParamWrapper"
    with pytest.raises(ConfigError, match=r"target_parameters=\['mlp.experts.down_proj'\] needs rollout.engine=hf: grpolab hands"):
        GRPOTrainer(str(tmp_path / "base"), reward_len, {**_args(tmp_path), "rollout.engine": "vllm"}, ROWS, peft_config=lora)
