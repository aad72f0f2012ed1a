r"""Serves a model over an OpenAI-compatible HTTP endpoint: `python -m launch.serve
--model=DIR [--config=PRESET|FILE] [--port=8000]`.

The same program as the console script `jaxrl-llm-serve` (jaxrl_llm/serve_cli.py, where
the flags and exit statuses are documented), runnable from a checkout without installing:

  python -m launch.serve --model=jaxrl_llm/assets/calculator_sft --port=8000
"""
from jaxrl_llm import serve_cli

if __name__ == "__main__":
  serve_cli.run()
