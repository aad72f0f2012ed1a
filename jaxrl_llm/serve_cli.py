r"""`jaxrl-llm-serve`: serves a model over an OpenAI-compatible HTTP endpoint
(`jaxrl_llm.serving`):

  jaxrl-llm-serve --model=jaxrl_llm/assets/calculator_sft --port=8000
  python -m launch.serve --model=jaxrl_llm/assets/calculator_sft --config=grpo --port=8000
  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \
      -d '{"model": "calculator_sft", "messages": [{"role": "user", "content": "47*83"}]}'

`--model` is a Hugging Face directory (config.json, safetensors, a tokenizer with a chat
template). `--config` (optional: a preset name or a config file, with `--config.x.y=v`
overrides, as for `jaxrl-llm-train`) sets the compute dtype and the decode loop's layout
(`config.model.dtype`, `config.sampling.*`). The server binds 127.0.0.1 unless told
otherwise; any other host needs `--api_key`, which every request must then carry
(`Authorization: Bearer KEY`). Ctrl-C or SIGTERM closes it (exit status 0).

Exit status: 2 for a bad flag, config file or config value (one line on stderr, before the
model loads).
"""
import os
import signal
import threading

from absl import flags

from jaxrl_llm import command_line

_MODEL = flags.DEFINE_string("model", None, "Hugging Face directory of the model to serve.")
_CONFIG = command_line.config_flag("A preset name (grpo) or a config file (path[:arg]): the "
                                   "dtype and the decode layout (optional).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (loopback by default).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to bind (0: a free one).")
_API_KEY = flags.DEFINE_string("api_key", None, "Key every request must carry; required to "
                               "bind beyond loopback. Or $JAXRL_LLM_API_KEY.")
_NAME = flags.DEFINE_string("served_model_name", None, "The `model` requests must name "
                            "(default: the directory's name).")
_SLOTS = flags.DEFINE_integer("slots", 16, "Requests decoded at once.")
_CONTEXT = flags.DEFINE_integer("context", 2048, "Tokens per request, prompt and completion.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 512, "New tokens of a request that gives none.")
_PAGE = flags.DEFINE_integer("page_size", 16, "Tokens per KV-cache page.")
_CHUNK = flags.DEFINE_integer("chunk_steps", 8, "Decode steps per device call (new requests "
                              "join between calls).")
_PREFILL = flags.DEFINE_integer("prefill_chunk", 0, "Prompt tokens prefilled per engine step "
                                "(0: whole prompts; else a multiple of --page_size): a longer "
                                "prompt goes in pieces while the others decode.")
_QUEUE = flags.DEFINE_integer("max_waiting", 256, "Requests that may wait for a slot; more get 429.")
flags.mark_flags_as_required(["model"])


def main():
  from jaxrl_llm import serving  # pylint: disable=g-import-not-at-top
  api_key = _API_KEY.value or os.environ.get("JAXRL_LLM_API_KEY")
  try:
    serving.server.check_binding(_HOST.value, api_key)
    layout = serving.Layout(slots=_SLOTS.value, context=_CONTEXT.value, page_size=_PAGE.value,
                            chunk_steps=_CHUNK.value, top_logprobs=20,
                            prefill_chunk=_PREFILL.value)
    if not os.path.isdir(_MODEL.value):
      raise ValueError(f"--model={_MODEL.value!r}: expected a Hugging Face directory")
  except ValueError as e:
    command_line.usage_error(f"launch.serve: {e}", flags_help=False)
  backend = serving.load_backend(_MODEL.value, layout, config=_CONFIG.value,
                                 name=_NAME.value, max_tokens=_MAX_TOKENS.value,
                                 max_waiting=_QUEUE.value)
  stop = threading.Event()  # Ctrl-C or SIGTERM, wherever the main thread is when it comes
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.set())
  server = serving.Server(backend, _HOST.value, _PORT.value, api_key)
  print(f"serving {backend.model_name!r} at {server.base_url} (Ctrl-C stops)", flush=True)
  try:
    while not stop.wait(0.5) and server.running:
      pass
  finally:
    server.close()
    backend.engine.close()


def run():
  command_line.run(main, _CONFIG)


if __name__ == "__main__":
  run()
