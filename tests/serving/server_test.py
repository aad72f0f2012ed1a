"""The HTTP endpoint through the real `openai` client: answers are the model's own (log-probs
of its forward pass, greedy tokens of transformers' generate), reproducible and independent
of concurrent requests; tool calls come back as OpenAI's `tool_calls`; every bad request gets
its error and the server goes on answering; `launch.serve` runs it from the command line
(`--config` a preset name, as for training)."""
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import numpy as np
import openai
import torch
from absl.testing import absltest

import jaxrl_llm
from jaxrl_llm import data, serving
from jaxrl_llm.config import presets
from jaxrl_llm.envs.calculator_agent import CALC
from tests import hf_testing

ASSETS = os.path.join(os.path.dirname(jaxrl_llm.__file__), "assets")
TOKENIZER = os.path.join(ASSETS, "char_tools_tokenizer")
CALCULATOR = os.path.join(ASSETS, "calculator_sft")
REPO = os.path.dirname(os.path.dirname(jaxrl_llm.__file__))
NAME = "tiny"
CONTEXT = 64
# Chat prompts are `U:` + content + `<eos> A:`: contents of 3 to 10 characters make prompts
# of 9 to 16 tokens, one admission bucket (two pages of 8); "hello" (5 tokens) is another.
LAYOUT = dict(slots=4, context=CONTEXT, page_size=8, chunk_steps=8, top_logprobs=5)


def _tiny_model_dir(**overrides):
  """A tiny random llama with the character tokenizer (its ids, its chat template)."""
  tokenizer = data.load_tokenizer(TOKENIZER)
  hf = hf_testing.make_hf_model("llama", num_hidden_layers=2, vocab_size=len(tokenizer),
                                bos_token_id=tokenizer.bos_token_id,
                                eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id, **overrides)
  path = hf_testing.save_hf_model(hf, os.path.join(tempfile.mkdtemp(), NAME))
  for name in os.listdir(TOKENIZER):
    shutil.copy(os.path.join(TOKENIZER, name), path)
  return hf, tokenizer, path


def _user(content):
  return [{"role": "user", "content": content}]


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def _post(url, body: bytes, headers=None):
  """(status, parsed JSON) of a raw POST."""
  request = urllib.request.Request(url, data=body, method="POST", headers={
      "Content-Type": "application/json", **(headers or {})})
  return _open(request)


def _open(request):
  """(status, the body parsed as JSON, or as text if it is not JSON)."""
  try:
    with urllib.request.urlopen(request, timeout=120) as response:
      status, body = response.status, response.read()
  except urllib.error.HTTPError as e:
    status, body = e.code, e.read()
  try:
    return status, json.loads(body)
  except ValueError:
    return status, body.decode("utf-8", "replace")


class ServerTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf, cls.tokenizer, cls.model_dir = _tiny_model_dir()
    cls.backend = serving.load_backend(cls.model_dir, serving.Layout(**LAYOUT), max_tokens=12)
    cls.server = serving.Server(cls.backend)
    cls.client = openai.OpenAI(base_url=cls.server.base_url, api_key="x", max_retries=0)

  @classmethod
  def tearDownClass(cls):
    cls.client.close()
    cls.server.close()
    cls.backend.engine.close()
    super().tearDownClass()

  def chat(self, content="hi 2+2", **kw):
    kw.setdefault("max_tokens", 12)
    return self.client.chat.completions.create(model=NAME, messages=_user(content), **kw)

  def assert_answers(self):
    """The server still answers a good request."""
    response = self.chat(seed=0, max_tokens=4)
    self.assertLen(response.choices, 1)
    self.assertNotEmpty(response.choices[0].model_extra["token_ids"])

  # -- the model's own answers ------------------------------------------------------------

  def test_models_lists_the_model(self):
    models = self.client.models.list().data
    self.assertEqual([m.id for m in models], [NAME])
    self.assertEqual(models[0].model_extra["max_model_len"], CONTEXT)

  def test_chat_logprobs_are_the_models_own(self):
    """Behaviour log-probs: log_softmax(logits / T) of the full vocabulary (before top-p),
    the logits of transformers' float32 forward pass; alternatives sorted, the first the
    most likely; the prompt is the chat template's rendering."""
    messages = _user("what is 3*4")
    text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want_prompt = self.tokenizer.encode(text, add_special_tokens=False)
    for temperature, top_p in ((1.0, 0.9), (0.7, 1.0)):
      response = self.client.chat.completions.create(
          model=NAME, messages=messages, max_tokens=12, temperature=temperature, top_p=top_p,
          seed=11, logprobs=True, top_logprobs=3)
      prompt = response.model_extra["prompt_token_ids"]
      choice = response.choices[0]
      tokens = choice.model_extra["token_ids"]
      self.assertEqual(prompt, want_prompt)
      self.assertNotEmpty(tokens)
      ids = np.asarray([prompt + tokens])
      logits = hf_testing.hf_logits(self.hf, ids, np.ones_like(ids))[0]
      logp = _log_softmax(logits[len(prompt) - 1:-1] / temperature)
      content = choice.logprobs.content
      self.assertLen(content, len(tokens))
      got = [c.logprob for c in content]
      np.testing.assert_allclose(got, logp[np.arange(len(tokens)), tokens], atol=1e-5,
                                 err_msg=f"temperature {temperature}")
      for i, (c, t) in enumerate(zip(content, tokens)):
        self.assertEqual(c.token, self.tokenizer.decode([t]))
        self.assertLen(c.top_logprobs, 3)
        top = [a.logprob for a in c.top_logprobs]
        self.assertEqual(top, sorted(top, reverse=True))
        np.testing.assert_allclose(top, np.sort(logp[i])[::-1][:3], atol=1e-5)
        self.assertEqual(c.top_logprobs[0].token, self.tokenizer.decode([int(np.argmax(logp[i]))]))
      if choice.finish_reason == "stop":
        self.assertEqual(tokens[-1], self.tokenizer.eos_token_id)
      else:
        self.assertEqual(choice.finish_reason, "length")
        self.assertLen(tokens, 12)
      ending = tokens[:-1] if tokens[-1] == self.tokenizer.eos_token_id else tokens
      self.assertEqual(choice.message.content, self.tokenizer.decode(ending))
      self.assertEqual(response.usage.prompt_tokens, len(prompt))
      self.assertEqual(response.usage.completion_tokens, len(tokens))

  def test_greedy_is_transformers_generate(self):
    eos = self.tokenizer.eos_token_id
    for content in ("hi there", "12+30=?"):
      response = self.chat(content, temperature=0, max_tokens=16)
      prompt = response.model_extra["prompt_token_ids"]
      with torch.no_grad():
        out = self.hf.generate(input_ids=torch.tensor([prompt]),
                               attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               do_sample=False, max_new_tokens=16, eos_token_id=eos,
                               pad_token_id=self.tokenizer.pad_token_id)
      want = out[0, len(prompt):].tolist()
      if eos in want:
        want = want[:want.index(eos) + 1]
      self.assertEqual(response.choices[0].model_extra["token_ids"], want, content)
      self.assertEqual(response.choices[0].finish_reason, "stop" if eos in want else "length")
    # The same by /v1/completions, the prompt given as token ids.
    completion = self.client.completions.create(model=NAME, prompt=prompt, max_tokens=16,
                                                temperature=0)
    self.assertEqual(completion.choices[0].model_extra["token_ids"], want)

  def test_n_choices_and_seeds(self):
    first = self.chat(n=3, seed=5)
    again = self.chat(n=3, seed=5)
    tokens = lambda r: [c.model_extra["token_ids"] for c in r.choices]
    self.assertEqual([c.index for c in first.choices], [0, 1, 2])
    self.assertEqual(tokens(again), tokens(first))
    self.assertLen({tuple(t) for t in tokens(first)}, 3)  # each choice draws its own
    # Choice i draws from fold_in(PRNGKey(seed), i): n=1 gives choice 0.
    self.assertEqual(tokens(self.chat(seed=5)), tokens(first)[:1])
    self.assertNotEqual(tokens(self.chat(seed=6)), tokens(first)[:1])
    self.assertEqual(first.usage.completion_tokens, sum(len(t) for t in tokens(first)))

  def test_completions_text_in_text_out(self):
    response = self.client.completions.create(model=NAME, prompt="hello", max_tokens=7, seed=3,
                                              logprobs=2)
    prompt = response.model_extra["prompt_token_ids"]
    self.assertEqual(prompt, self.tokenizer.encode("hello", add_special_tokens=False))
    choice = response.choices[0]
    tokens = choice.model_extra["token_ids"]
    self.assertEqual(choice.text, self.tokenizer.decode(tokens, skip_special_tokens=True))
    self.assertEqual(len(tokens) == 7, choice.finish_reason == "length")
    self.assertLen(choice.logprobs.tokens, len(tokens))
    self.assertLen(choice.logprobs.token_logprobs, len(tokens))
    self.assertTrue(all(len(top) <= 2 for top in choice.logprobs.top_logprobs))
    ids = np.asarray([prompt + tokens])
    logits = hf_testing.hf_logits(self.hf, ids, np.ones_like(ids))[0]
    logp = _log_softmax(logits[len(prompt) - 1:-1])
    np.testing.assert_allclose(choice.logprobs.token_logprobs,
                               logp[np.arange(len(tokens)), tokens], atol=1e-5)
    # Token ids in: the same completion.
    by_ids = self.client.completions.create(model=NAME, prompt=prompt, max_tokens=7, seed=3)
    self.assertEqual(by_ids.choices[0].model_extra["token_ids"], tokens)
    self.assertEqual(by_ids.choices[0].text, choice.text)

  def test_stream_sends_the_whole_answer(self):
    """`stream: true`: the answer of the same request without it, in chunks, then [DONE]."""
    whole = self.chat(seed=8, n=2)
    stream = self.chat(seed=8, n=2, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text, finish, usage = {0: "", 1: ""}, {}, None
    for chunk in chunks:
      for c in chunk.choices:
        text[c.index] += c.delta.content or ""
        if c.finish_reason is not None:
          finish[c.index] = (c.finish_reason, c.model_extra.get("token_ids"))
      usage = chunk.usage or usage
    for c in whole.choices:
      self.assertEqual(text[c.index], c.message.content)
      self.assertEqual(finish[c.index], (c.finish_reason, c.model_extra["token_ids"]))
    self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)

  def test_concurrent_requests_get_what_they_get_alone(self):
    contents = [("abcdefghij" * 2)[i % 7:i % 7 + 3 + i % 8] for i in range(16)]
    self.assertEqual({3, 4, 5, 6, 7, 8, 9, 10}, {len(c) for c in contents})
    alone = [self.chat(c, seed=100 + i, logprobs=True) for i, c in enumerate(contents)]

    async def together():
      async with openai.AsyncOpenAI(base_url=self.server.base_url, api_key="x",
                                    max_retries=0) as client:
        return await asyncio.gather(*[client.chat.completions.create(
            model=NAME, messages=_user(c), max_tokens=12, seed=100 + i, logprobs=True)
                                      for i, c in enumerate(contents)])

    got = asyncio.run(together())
    for i, (a, b) in enumerate(zip(alone, got)):
      self.assertEqual(b.model_extra["prompt_token_ids"], a.model_extra["prompt_token_ids"])
      self.assertEqual(b.choices[0].model_extra["token_ids"],
                       a.choices[0].model_extra["token_ids"], f"request {i}")
      np.testing.assert_allclose([c.logprob for c in b.choices[0].logprobs.content],
                                 [c.logprob for c in a.choices[0].logprobs.content], atol=1e-5)
    self.assertGreater(len({tuple(a.choices[0].model_extra["token_ids"]) for a in alone}), 12)

  # -- errors -------------------------------------------------------------------------------

  def test_malformed_json(self):
    for body in (b'{"model": "tiny", "messages": [', b"[1, 2]", b"null", b""):
      status, answer = _post(self.server.base_url + "/chat/completions", body)
      self.assertEqual(status, 400, body)
      self.assertEqual(answer["error"]["type"], "invalid_request_error", body)
      self.assertIsInstance(answer["error"]["message"], str)
      self.assert_answers()

  def test_every_refusal_has_the_openai_error_shape(self):
    """A body that is not UTF-8, an unknown route, a wrong method: refused, in OpenAI's
    {"error": {...}} shape like every other refusal."""
    url = self.server.base_url
    answers = {"not utf-8": _post(url + "/chat/completions", b"\xff\xfe not json"),
               "unknown route": _post(url + "/chat/complete", b"{}"),
               "wrong method": _open(urllib.request.Request(url + "/chat/completions"))}
    self.assertEqual({k: v[0] for k, v in answers.items()},
                     {"not utf-8": 400, "unknown route": 404, "wrong method": 405})
    self.assert_answers()
    shapes = {k: isinstance(v[1], dict) and "message" in v[1].get("error", {})
              for k, v in answers.items()}
    self.assertEqual(shapes, dict.fromkeys(answers, True),
                     "refusals that FastAPI raises itself (starlette's HTTPException: a body it "
                     "cannot decode, a route or method it does not know) come back in FastAPI's "
                     "shape {'detail': ...}, not OpenAI's {'error': {...}}: api.make_app has no "
                     f"handler for them. Answers: {answers}")

  def test_bad_requests_are_refused_and_the_server_goes_on(self):
    long_text = "x" * (CONTEXT + 10)
    cases = [
        # (status, error class, code or None, message pattern, the request)
        (400, openai.BadRequestError, None, "bogus_field",
         lambda: self.chat(extra_body={"bogus_field": 1})),
        (400, openai.BadRequestError, "context_length_exceeded", "do not fit the context",
         lambda: self.chat(long_text)),
        (400, openai.BadRequestError, "context_length_exceeded", "do not fit the context",
         lambda: self.client.completions.create(model=NAME, prompt=[5] * (CONTEXT + 1))),
        (400, openai.BadRequestError, "context_length_exceeded", "max_tokens=100",
         lambda: self.chat(max_tokens=100)),
        (400, openai.BadRequestError, None, "max_tokens",
         lambda: self.chat(max_tokens=0)),
        (400, openai.BadRequestError, None, "top_logprobs=6",  # the layout keeps 5
         lambda: self.chat(logprobs=True, top_logprobs=6)),
        (400, openai.BadRequestError, None, "temperature",
         lambda: self.chat(temperature=2.5)),
        (400, openai.BadRequestError, None, "n",
         lambda: self.chat(n=0)),
        (400, openai.BadRequestError, None, "role",
         lambda: self.client.chat.completions.create(
             model=NAME, messages=[{"role": "wizard", "content": "hi"}])),
        (400, openai.BadRequestError, None, "tool_choice",
         lambda: self.chat(tools=[CALC], tool_choice="required")),
        (400, openai.BadRequestError, None, "echo",
         lambda: self.client.completions.create(model=NAME, prompt="hi", echo=True)),
        (404, openai.NotFoundError, "model_not_found", "'gpt-4o'",
         lambda: self.client.chat.completions.create(model="gpt-4o", messages=_user("hi"))),
        (404, openai.NotFoundError, "model_not_found", "'gpt-4o'",
         lambda: self.client.completions.create(model="gpt-4o", prompt="hi")),
    ]
    for status, error, code, pattern, call in cases:
      with self.subTest(pattern):
        with self.assertRaises(error) as caught:
          call()
        self.assertEqual(caught.exception.status_code, status)
        self.assertRegex(caught.exception.message, pattern)
        self.assertIsNotNone(caught.exception.type)  # OpenAI's {"error": {...}}
        if code is not None:
          self.assertEqual(caught.exception.code, code)
        self.assert_answers()

  def test_out_of_vocabulary_prompt_ids_are_refused(self):
    """/v1/completions takes token ids: ids outside [0, vocab) must be refused (400, as the
    static sampler refuses them), and must not change what later requests get."""
    V = len(self.tokenizer)
    # A server of its own (the same programs, from the compilation cache): a slot this test
    # spoils must not spoil the other tests.
    backend = serving.load_backend(self.model_dir, serving.Layout(**LAYOUT), max_tokens=12)
    server = serving.Server(backend)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
      good = dict(model=NAME, prompt="hello", max_tokens=12, seed=1)
      before = client.completions.create(**good).choices[0].model_extra["token_ids"]
      statuses, sampled = {}, {}
      for prompt in ([5, -1], [5, V + 3]):
        for logprobs in (None, 1):
          status, answer = _post(server.base_url + "/completions", json.dumps(
              {"model": NAME, "prompt": prompt, "max_tokens": 12, "seed": 0,
               "logprobs": logprobs}).encode())
          statuses[f"prompt={prompt} logprobs={logprobs}"] = status
          if status == 200:
            sampled[str(prompt)] = answer["choices"][0]["token_ids"]
      after = client.completions.create(**good).choices[0].model_extra["token_ids"]
    finally:
      client.close()
      server.close()
      backend.engine.close()
    self.assertEqual(
        (statuses, after), (dict.fromkeys(statuses, 400), before),
        "prompt ids outside the vocabulary are not refused: an id >= vocab_size embeds as NaN "
        "(jnp.take fills), the NaN logits make the engine 'sample' token id vocab_size "
        "(choose._argmax_rows finds no maximum) and, with logprobs, the NaN log-probs fail "
        "JSON encoding (500); -1 silently reads the last embedding row. The NaN keys and "
        "values stay in the slot's pages: the next request there (a good one, the same as "
        f"before) decodes NaN too. Sampled: {sampled}; the good request before: {before}, "
        f"after: {after}")

  def test_api_key(self):
    with self.assertRaisesRegex(ValueError, "api_key"):
      serving.Server(self.backend, host="0.0.0.0")
    guarded = serving.Server(self.backend, api_key="sekret")
    try:
      for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
        status, answer = _open(urllib.request.Request(guarded.base_url + "/models",
                                                      headers=headers))
        self.assertEqual(status, 401, headers)
        self.assertEqual(answer["error"]["code"], "invalid_api_key")
      wrong = openai.OpenAI(base_url=guarded.base_url, api_key="wrong", max_retries=0)
      with self.assertRaises(openai.AuthenticationError):
        wrong.chat.completions.create(model=NAME, messages=_user("hi"), max_tokens=2)
      right = openai.OpenAI(base_url=guarded.base_url, api_key="sekret", max_retries=0)
      self.assertEqual([m.id for m in right.models.list().data], [NAME])
      response = right.chat.completions.create(model=NAME, messages=_user("hi 2+2"),
                                               max_tokens=12, seed=5)
      self.assertEqual(response.choices[0].model_extra["token_ids"],
                       self.chat(seed=5).choices[0].model_extra["token_ids"])
    finally:
      guarded.close()


class QueueFullTest(absltest.TestCase):

  def test_a_full_queue_answers_429(self):
    """One slot, one waiting request: of 8 sent at once, the ones beyond get 429, the
    others their completions; then the server answers again."""
    _, _, model_dir = _tiny_model_dir()
    layout = serving.Layout(slots=1, context=CONTEXT, page_size=8, chunk_steps=8, top_logprobs=0)
    backend = serving.load_backend(model_dir, layout, max_tokens=40, max_waiting=1)
    server = serving.Server(backend)
    try:
      async def send():
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x",
                                      max_retries=0) as client:
          return await asyncio.gather(*[client.completions.create(
              model=NAME, prompt="count to ten", max_tokens=40, seed=i) for i in range(8)],
                                      return_exceptions=True)

      answers = asyncio.run(send())
      refused = [a for a in answers if isinstance(a, Exception)]
      done = [a for a in answers if not isinstance(a, Exception)]
      self.assertNotEmpty(refused)
      self.assertGreaterEqual(len(done), 1)
      for error in refused:
        self.assertIsInstance(error, openai.RateLimitError)
        self.assertEqual(error.status_code, 429)
        self.assertEqual(error.code, "rate_limit_exceeded")
      for answer in done:
        self.assertNotEmpty(answer.choices[0].model_extra["token_ids"])
      client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
      seed = answers.index(done[0])
      again = client.completions.create(model=NAME, prompt="count to ten", max_tokens=40,
                                        seed=seed)
      self.assertEqual(again.choices[0].model_extra["token_ids"],
                       done[0].choices[0].model_extra["token_ids"])
    finally:
      server.close()
      backend.engine.close()


class ToolCallTest(absltest.TestCase):

  def test_calculator_model_calls_its_tool(self):
    """The shipped calculator model, given the `calc` tool, writes a Hermes call about a
    third of the time: it comes back as `tool_calls` with JSON arguments."""
    layout = serving.Layout(slots=4, context=128, page_size=16, chunk_steps=16, top_logprobs=0)
    backend = serving.load_backend(CALCULATOR, layout, max_tokens=96)
    server = serving.Server(backend)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
      calls = []
      for seed in range(6):
        response = client.chat.completions.create(
            model="calculator_sft", messages=_user("47*83"), tools=[CALC], n=4, seed=seed,
            temperature=1.0)
        prompt = backend.tokenizer.decode(response.model_extra["prompt_token_ids"])
        self.assertIn("Tools: calc", prompt)
        for choice in response.choices:
          text = backend.tokenizer.decode(choice.model_extra["token_ids"])
          if choice.message.tool_calls:
            calls.append(choice)
            self.assertIn("<tool_call>", text)
          else:
            self.assertIn(choice.finish_reason, ("stop", "length"))
        if calls:
          break
      self.assertNotEmpty(calls, "no tool call in 24 answers")
      for choice in calls:
        self.assertEqual(choice.finish_reason, "tool_calls")
        call = choice.message.tool_calls[0]
        self.assertEqual(call.id, "call_0")
        self.assertEqual(call.type, "function")
        self.assertIn(call.function.name, ("calc", "calculator"))
        self.assertIsInstance(json.loads(call.function.arguments), dict)
      # Without tools the same request renders no tool list.
      plain = client.chat.completions.create(model="calculator_sft", messages=_user("47*83"),
                                             tools=[CALC], tool_choice="none", max_tokens=2)
      self.assertNotIn("Tools:", backend.tokenizer.decode(plain.model_extra["prompt_token_ids"]))
    finally:
      client.close()
      server.close()
      backend.engine.close()


class LaunchServeTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = _tiny_model_dir()[2]

  def serve(self, *flags):
    return subprocess.Popen([sys.executable, "-m", "launch.serve", f"--model={self.model_dir}",
                             *flags], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)

  def test_host_beyond_loopback_needs_an_api_key(self):
    process = self.serve("--host=0.0.0.0")
    out, err = process.communicate(timeout=120)
    self.assertEqual(process.returncode, 2, err)
    self.assertEqual(out, "")
    lines = err.strip().splitlines()
    self.assertLen(lines, 1, err)
    self.assertRegex(lines[0], r"^launch\.serve: --host='0\.0\.0\.0' .*--api_key")

  def test_config_takes_a_preset_name(self):
    """`--config=grpo` is the preset, as for launch.train: its file is loaded with the flags,
    before the model loads (here it refuses an argument it does not take: one line, exit 2)."""
    process = self.serve("--config=grpo:nonsense")
    out, err = process.communicate(timeout=120)
    self.assertEqual(process.returncode, 2, err)
    self.assertEqual(out, "")
    self.assertIn(f"--config={presets.path('grpo')}:nonsense: ", err)
    self.assertRegex(err, r"Unknown config argument 'nonsense'; valid: \[.*'runlocal'")
    self.assertNotIn("Traceback", err)

  def test_serves_on_a_free_port(self):
    process = self.serve("--port=0", "--slots=2", f"--context={CONTEXT}", "--page_size=8")
    try:
      line = process.stdout.readline()
      found = re.fullmatch(r"serving 'tiny' at (http://127\.0\.0\.1:(\d+)/v1) \(Ctrl-C stops\)\n",
                           line)
      self.assertIsNotNone(found, f"stdout: {line!r}")
      self.assertNotEqual(found.group(2), "0")
      status, answer = _open(urllib.request.Request(found.group(1) + "/models"))
      self.assertEqual(status, 200)
      self.assertEqual([m["id"] for m in answer["data"]], [NAME])
      self.assertEqual(answer["data"][0]["max_model_len"], CONTEXT)
      process.send_signal(signal.SIGINT)  # Ctrl-C: closes the server, exits cleanly
      process.wait(timeout=60)
      self.assertEqual(process.returncode, 0, process.stderr.read())
    finally:
      if process.poll() is None:
        process.kill()
        process.wait()
      process.stdout.close()
      process.stderr.close()


if __name__ == "__main__":
  absltest.main()
